"""Test support shared by every test directory, importable as ``support`` (pytest's ``pythonpath`` puts
``tests/`` on the path): fake engines, real routers on 127.0.0.1, request bodies, routing cores, the
folders' kits, what a test needs (``needs``) and polling helpers. Fixtures stay in the ``conftest.py``
files; what they build lives here."""
