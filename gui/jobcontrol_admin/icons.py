"""The tree's icons, drawn once in code (no image files to ship), cached by their key.

Spec 10.2's key: a task (normal or error); a box of the timed or the
consecutive family, closed or open, each with an error variant; the on-error
icon of boxes (continue or stop); a script icon for a timer or a command. A
task or box in a run carries a badge too (a green "play" while it runs, an
amber "pause" while a TIMED box waits), so it stands out when selected as well.
"""

from __future__ import annotations

from functools import cache

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPainterPath, QPen, QPixmap, QPolygonF

SIZE = 16
ERROR = QColor("#c62828")


def _canvas() -> tuple[QPixmap, QPainter]:
    pixmap = QPixmap(SIZE, SIZE)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    return pixmap, painter


def _busy_badge(painter: QPainter, busy: str) -> None:
    """Bottom left: a green disc with a play triangle (running) or amber with a pause."""
    if busy not in ("running", "waiting"):
        return
    running = busy == "running"
    painter.setPen(QPen(QColor("white"), 1))
    painter.setBrush(QColor("#2e7d32") if running else QColor("#ef8f00"))
    painter.drawEllipse(QRectF(0.5, 8.5, 7, 7))
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor("white"))
    if running:
        painter.drawPolygon(QPolygonF([QPointF(3, 10), QPointF(6, 12), QPointF(3, 14)]))
    else:
        painter.drawRect(QRectF(2.5, 10.3, 1.2, 3.4))
        painter.drawRect(QRectF(4.4, 10.3, 1.2, 3.4))


def _error_badge(painter: QPainter) -> None:
    painter.setPen(QPen(QColor("white"), 1))
    painter.setBrush(ERROR)
    painter.drawEllipse(QRectF(8.5, 8.5, 7, 7))
    painter.setPen(QPen(QColor("white"), 1.5))
    painter.drawLine(QPointF(12, 10), QPointF(12, 12.6))
    painter.drawPoint(QPointF(12, 14.2))


@cache
def task(*, error: bool = False, busy: str = "idle") -> QIcon:
    pixmap, p = _canvas()
    p.setPen(QPen(QColor("#37474f"), 1))
    p.setBrush(QColor("#eceff1"))
    p.drawRoundedRect(QRectF(1.5, 2.5, 13, 11), 1.5, 1.5)
    p.setPen(QPen(QColor("#37474f"), 1.3))
    p.drawPolyline(QPolygonF([QPointF(4, 6), QPointF(6.5, 8), QPointF(4, 10)]))
    p.drawLine(QPointF(8, 10.5), QPointF(11.5, 10.5))
    if error:
        _error_badge(p)
    _busy_badge(p, busy)
    p.end()
    return QIcon(pixmap)


@cache
def box(*, timed: bool, expanded: bool, error: bool = False, busy: str = "idle") -> QIcon:
    """A folder; timed boxes are blue with a clock face, consecutive ones amber with an arrow."""
    pixmap, p = _canvas()
    fill = QColor("#64b5f6") if timed else QColor("#ffca28")
    edge = fill.darker(160)
    p.setPen(QPen(edge, 1))
    p.setBrush(fill.lighter(115))
    p.drawRect(QRectF(1.5, 3.5, 5, 2))  # the tab
    if expanded:
        p.setBrush(fill.darker(110))
        p.drawRect(QRectF(1.5, 5, 13, 9))
        p.setBrush(fill)
        path = QPainterPath()
        path.addPolygon(
            QPolygonF([QPointF(3.5, 8), QPointF(15, 8), QPointF(13, 14), QPointF(1.5, 14)])
        )
        p.drawPath(path)
    else:
        p.setBrush(fill)
        p.drawRect(QRectF(1.5, 5, 13, 9))
    p.setPen(QPen(edge.darker(130), 1.2))
    if timed:
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawEllipse(QRectF(5, 7, 6, 6))
        p.drawLine(QPointF(8, 10), QPointF(8, 8.2))
        p.drawLine(QPointF(8, 10), QPointF(9.6, 10))
    else:
        p.drawLine(QPointF(4.5, 10.5), QPointF(10.5, 10.5))
        p.drawPolyline(QPolygonF([QPointF(8.5, 8.5), QPointF(10.7, 10.5), QPointF(8.5, 12.5)]))
    if error:
        _error_badge(p)
    _busy_badge(p, busy)
    p.end()
    return QIcon(pixmap)


@cache
def on_error(continues: bool) -> QIcon:
    """Continue on error: a green arrow going on; abort on error: a red stop sign."""
    pixmap, p = _canvas()
    if continues:
        p.setPen(QPen(QColor("#2e7d32"), 2))
        p.drawLine(QPointF(2.5, 8), QPointF(12, 8))
        p.drawPolyline(QPolygonF([QPointF(8.5, 4.5), QPointF(12.5, 8), QPointF(8.5, 11.5)]))
    else:
        p.setPen(QPen(QColor("#8e0000"), 1))
        p.setBrush(ERROR)
        points = [
            (5, 1.5),
            (11, 1.5),
            (14.5, 5),
            (14.5, 11),
            (11, 14.5),
            (5, 14.5),
            (1.5, 11),
            (1.5, 5),
        ]
        p.drawPolygon(QPolygonF([QPointF(x, y) for x, y in points]))
        p.setPen(QPen(QColor("white"), 2))
        p.drawLine(QPointF(4.5, 8), QPointF(11.5, 8))
    p.end()
    return QIcon(pixmap)


@cache
def script() -> QIcon:
    pixmap, p = _canvas()
    p.setPen(QPen(QColor("#5d4037"), 1))
    p.setBrush(QColor("#fff8e1"))
    p.drawRect(QRectF(3.5, 1.5, 10, 13))
    p.setPen(QPen(QColor("#8d6e63"), 1))
    for y in (4.5, 7, 9.5, 12):
        p.drawLine(QPointF(5.5, y), QPointF(11.5, y))
    p.end()
    return QIcon(pixmap)


@cache
def magnifier(*, bold: bool = False) -> QIcon:
    pixmap, p = _canvas()
    p.setPen(QPen(QColor("#263238"), 2.2 if bold else 1.3))
    p.setBrush(Qt.BrushStyle.NoBrush)
    p.drawEllipse(QRectF(2, 2, 8, 8))
    p.drawLine(QPointF(9, 9), QPointF(14, 14))
    p.end()
    return QIcon(pixmap)
