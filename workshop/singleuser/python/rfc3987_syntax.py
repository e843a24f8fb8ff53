"""Learners' servers skip the rfc3987-syntax package (this folder is first on their PYTHONPATH).

It builds its IRI grammar when imported, about 2.4 s of CPU, and jupyter_server imports it at
start through jsonschema: 30 servers starting together would spend over a minute of CPU on it.
Without it jsonschema leaves out its "iri" format check, which Jupyter's own schemas do not use.
"""
raise ImportError("rfc3987_syntax is skipped in workshop servers (workshop/singleuser/python)")
