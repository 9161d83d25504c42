"""Tests of the process side: real forks, real signals, real SIGKILL."""
