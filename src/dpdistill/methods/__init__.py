"""One module per method behind one interface (base.py), run by one lifecycle (lifecycle.py); every method by name
in dpdistill/registry.py, which `dpdistill.methods()` lists."""
