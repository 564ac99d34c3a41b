"""The admin API: HTTP/JSON under ``/api/v1`` and an event stream, served by the daemon.

The only part of ``jobcontrol`` that imports the web framework (an
import-linter contract keeps the core free of it). Handlers validate, call the
``Engine``, and map its refusals to 4xx answers; they never touch run state.
"""
