"""The host agent: runs on a GPU instance, reads its GPUs through NVML, converges them
to a declared layout, reclaims slices and reports. It never decides; it converges.

`python -m host_agent --help` lists the verbs; host_agent.cli.main is the entry point.
"""
