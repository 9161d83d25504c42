"""Crash-state tests: a workload's file-system operations, recorded with strace, replayed
into every state a power cut could leave under two persistence models, each recovered
with forkvisor's own tools and checked (docs/RELIABILITY.md, "Power loss")."""
