"""Process-level tests of the job store: real forks, real SIGKILL, real files."""
