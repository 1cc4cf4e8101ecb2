"""Federated transcription on Flower: data owners' teachers answer through secure aggregation.

- protocol.py: what crosses the wire, the terms an owner derives and checks itself, the owner's boundary check,
  the integer encoding, each query's cost.
- answers.py: what an owner's teachers answer (vote counts).
- client_app.py / server_app.py: Flower's ClientApp (an owner) and ServerApp (the rounds over SecAgg+).
- engines.py: Flower's simulation in one process, a loopback deployment of separate processes, or the server across
  machines; parties.py: each party's command across machines; graph.py: SecAgg+'s key-sharing graph.
- owners.py: simulated owners (holdings and teachers) on one machine.
- config.py: the run's settings.
"""
