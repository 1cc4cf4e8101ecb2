"""How Flower's SecAgg+ scales with the owners on the full graph (every owner a neighbour of every other, as
`dpdistill federated` runs it): the Shamir sharing of one 32-byte secret among N owners with threshold N, split
and combined with Flower's own functions (pycryptodome's pure-Python GF(2^128) arithmetic). Each round every owner
splits two secrets and the server combines one per owner, so a round costs about N (2 split + combine)."""

import os
import sys
import time

from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares


def main(owners: list[int]) -> None:
    for count in owners:
        secret = os.urandom(32)
        started = time.perf_counter()
        shares = create_shares(secret, count, count)
        split = time.perf_counter() - started
        started = time.perf_counter()
        assert combine_shares(shares) == secret
        combine = time.perf_counter() - started
        print(f"{count} owners: split {split:.3f} s, combine {combine:.3f} s, a round's sharing about "
              f"{count * (2 * split + combine):.0f} s", flush=True)


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [10, 20, 40, 80, 160, 250])
