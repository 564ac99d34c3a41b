"""``jobcontrol-admin``: the Qt admin client of Job Control (Inq's jcAdmin, and more).

It talks to a daemon only through the admin API (``jobcontrol.client.api``) and its
event stream, on worker threads: the GUI thread never waits on the network.

* ``session``: API calls on worker threads, results delivered on the GUI thread;
* ``feed``: the snapshot and the live event stream, reconnecting by itself;
* ``model``: the tree of jobs as a Qt item model, changed in place by events;
* ``window``: the main window, its menus, toolbar and panels;
* ``workers``: the Workers & Lanes panel (workers, lanes, the queue, and their actions);
* ``app``: the ``jobcontrol-admin`` entry point.
"""
