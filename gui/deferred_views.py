"""The window's views that need pyqtgraph (the live charts, Compare, Numerics): importing
it and making their plots takes about a second, so each is built after the window's first
paint, one per turn of the event loop (input is handled between), or at once when
something uses it before then. Until built, a plain widget holds its place.
"""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QWidget


class Deferred:
    """A view that needs pyqtgraph (its import and plots take about a second): built after
    the window's first paint, or at once when something uses it before then."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, window, owner=None):
        if window is None:
            return self
        return window._built.get(self.name) or window._build(self.name)


class DeferredViews:
    """Building the ``Deferred`` views of a MainWindow (a mixin: the window's constructor
    makes ``_built`` and ``_holders``)."""

    def _holder(self, name: str) -> QWidget:
        holder = QWidget()
        self._holders[name] = holder
        return holder

    def _build(self, name: str) -> QWidget:
        view = getattr(self, f"_make_{name}")()
        holder = self._holders.pop(name)
        if name == "charts":
            self._run_right.replaceWidget(0, view)
        else:  # a tab: the view takes the stand-in's place, the current tab stays
            index, current = self.tabs.indexOf(holder), self.tabs.currentIndex()
            blocked = self.tabs.blockSignals(True)  # the swap is not the user changing tab
            self.tabs.insertTab(index, view, self.tabs.tabText(index))
            self.tabs.removeTab(index + 1)
            self.tabs.setCurrentIndex(current)
            self.tabs.blockSignals(blocked)
        holder.deleteLater()
        self._built[name] = view
        return view

    def _make_charts(self) -> QWidget:
        from gui.live_charts import LiveCharts

        return LiveCharts()

    def _make_compare_view(self) -> QWidget:
        from gui.compare_view import CompareView

        return CompareView()

    def _make_numerics_view(self) -> QWidget:
        from gui.numerics_view import NumericsView

        view = NumericsView()
        view.run_requested.connect(self.start_lab)
        view.stop_requested.connect(self.stop_lab)
        view.show_inputs(self.config_panel.form_values())
        self.config_panel.changed.connect(
            lambda: view.show_inputs(self.config_panel.form_values()))
        view.set_busy(self.worker.is_running() or self.lab_worker.is_running())
        return view

    def paintEvent(self, event) -> None:
        super().paintEvent(event)
        if self._holders and not getattr(self, "_building", False):
            self._building = True
            QTimer.singleShot(0, self._build_next)

    def _build_next(self) -> None:
        """One deferred view per turn of the event loop, so input is handled between."""
        if self._holders:
            getattr(self, next(iter(self._holders)))
        if self._holders:
            QTimer.singleShot(0, self._build_next)
        else:
            self.config_panel.start_probe()
            self.ready.emit()
