"""GUI tests run offscreen, with settings and history in a temporary folder."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _private_app_dirs(tmp_path, monkeypatch):
    """Keep QSettings and the history database out of the user's real folders."""
    from PySide6.QtCore import QSettings

    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "cfg"))
    yield
