"""The one door the API and the CLI use: edits, runs, views, users, audit, event log, metrics.

``engine`` is every edit, request and view; ``loader`` definition files in and
out of the database; ``users`` roles and tokens; ``audit`` the audit trail;
``eventlog`` the numbered, replayable event stream; ``metrics`` the counters
behind ``/metrics``.
"""
