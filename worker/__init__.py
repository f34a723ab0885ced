"""The worker: one agent per machine, running replicas of functions. Modules::

agent.py           the loop: register, heartbeat, consume, shut down
bootstrap.py       Settings -> Agent, and signals (the only settings reader)
consumer.py        Celery consumer of ``thaw.worker.<id>`` (the only Celery import)
control_client.py  HTTP to the control plane (register, heartbeat, events)
replicas.py        ReplicaManager: protocol tasks -> runtime -> events
runtimes/          the Runtime interface (base.py), process.py, docker.py
pool.py            generic replica processes and their pre-warmed pool
replica_child.py   the replica process: generic start, specialize, serve calls
specialize.py      code, weights, adapters and ``setup`` inside the child
adapters.py        adapters loaded on first use, kept under an LRU cap
child_protocol.py  messages between agent and child; frames.py carries them
artifacts.py       bundles, model files and weights from the snapshotter
profiling.py       a replica's first forward pass -> prefetch profile
inventory.py       tier holdings and bandwidths, for heartbeats
devices.py         devices and memory of this machine
sdk.py             what a function is and what it is given (the contract)
"""
