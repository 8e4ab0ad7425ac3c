"""Persistent settings (last configuration, window geometry) through QSettings.

Always the INI format under organisation "AmpScope", so ``QSettings.setPath`` can move
the file (tests point it at a temporary folder).
"""

from __future__ import annotations

import json

from PySide6.QtCore import QByteArray, QSettings

ORGANISATION = "AmpScope"
APPLICATION = "AmpScope"


def open_settings() -> QSettings:
    return QSettings(
        QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANISATION, APPLICATION
    )


def load_config_dict() -> dict:
    """The last configuration the user ran or edited; {} when none was saved or it is unreadable."""
    text = open_settings().value("config/last", "")
    try:
        data = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_config_dict(data: dict) -> None:
    open_settings().setValue("config/last", json.dumps(data))


def window_state() -> tuple[QByteArray | None, QByteArray | None]:
    """Saved geometry and dock/toolbar state; None for a value missing or of the wrong type."""
    store = open_settings()
    values = (store.value("window/geometry"), store.value("window/state"))
    return tuple(v if isinstance(v, QByteArray) and not v.isEmpty() else None for v in values)
