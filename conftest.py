"""Shared pytest setup for every package's tests and the top-level tests: kernellab.harness's pytest
plugin (hypothesis profiles ``ci``/``thorough``, the ``property`` and ``gpu`` markers, GPU tests skipped
without CUDA). Installed packages load it through its ``pytest11`` entry point; naming it here too
covers an environment whose harness was installed before the entry point existed (pytest loads a
plugin once per name, and the entry point carries the module's name)."""

pytest_plugins = ["kernellab.harness.pytest_plugin"]
