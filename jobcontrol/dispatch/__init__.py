"""The dispatcher: the one writer of tree state and timers (DESIGN "Dispatcher").

``dispatcher`` is the thread and its event loop; ``tree`` the in-memory job
tree; ``treestate`` the edit/reaction protocol; ``runs`` tree runs as state
machines; ``timers`` the timers of top-level trees; ``recovery`` what a crash
left. It queues runs and reads the ends workers record: it never imports a worker.
"""
