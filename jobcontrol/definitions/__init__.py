"""Job definitions as people write them: YAML/JSON files, durations, commands, editable fields.

``parse`` reads definition files, ``dump`` writes them back, ``fields`` checks
and normalises one job's editable fields whoever sent them, ``commands`` checks
command lines, ``durations`` reads ``90s``/``1h30m``. Nothing here touches the
database: ``jobcontrol.service.loader`` puts definitions in and out of it.
"""
