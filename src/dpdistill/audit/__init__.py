"""Empirical privacy audits: lower bounds on epsilon from what a run released, to check a guarantee's
implementation (a proof about code can be voided by a bug the accounting never sees)."""
