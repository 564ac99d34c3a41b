"""The timer language of a job's ``timer`` field: parse it, and work out when it next fires.

``expression`` is the language (intervals, times of day, weekdays, DST rules);
``cron`` the five-field cron expressions it accepts. Leaves: no engine, no store.
"""
