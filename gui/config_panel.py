"""The run configuration form.

It holds form values only; ``RunConfig`` decides what is valid. Every edit rebuilds the
config, and its ``ValueError`` message is shown inline in red while Run stays disabled.
Precisions the device cannot run are greyed out, with the engine's reason as tooltip,
and those it would run emulated (engine/measure/gating.py) are marked "(emulated)" in italics,
once the device probe (in a thread: it imports torch) has answered; until then the form
says "probing device…" and Run waits. Until the user (or their saved form) picks precisions,
the ticked ones are ``default_precisions`` for the device the probe found: fp32 beside the
autocast recipes it runs natively, so the first run has something to compare.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from engine.core.config import (
    DATA_DOCS,
    DATA_RANDOM,
    ISOLATIONS,
    OPTIMIZERS,
    PRECISIONS,
    REDUCE_DTYPES,
    STATE_OPTIMIZERS,
    STRATEGIES,
    RunConfig,
    default_precisions,
    split_keep,
    split_label,
)
from engine.core.resources import precision_descriptions
from engine.models.model_check import check_model
from engine.models.presets import presets
from engine.run.rounds import CHEAP_RULE
from gui.device_status import PROBING
from gui.palette import precision_color
from gui.worker import DeviceProbe

if TYPE_CHECKING:
    from engine.measure.device import DeviceInfo

MODEL_SOURCES = ("Preset", "Local folder", "Hub id")
REDUCE_AS_COMPUTED = "as computed"
# the per-layer variants resources/precisions.json describes, listed under their base recipe
KEEP_VARIANTS = {"fp8": ("fp8:keep-ends", "fp8:keep-attn")}
FORM_PRECISIONS = tuple(n for base in PRECISIONS for n in (base, *KEEP_VARIANTS.get(base, ())))
SOURCE_KINDS = ("preset", "folder", "hub")  # engine.models.model_check's names for the sources
# the engine's messages name CLI flags; the form names its fields
FIELD_OF_FLAG = {
    "--model": "Model", "--batch-size": "Batch size", "--seq-len": "Sequence length",
    "--steps": "Steps", "--warmup": "Warm-up steps", "--grad-accum": "Grad accumulation",
    "--growth-interval": "Growth interval", "--init-scale": "Initial loss scale",
    "--trust-remote-code": "Trust remote code", "--device": "Device",
    "--lr": "learning rate", "--lora-r": "LoRA rank",
    "--interleave": "Interleave precisions", "--rounds": "rounds",
    "--strategy": "Strategy", "--nproc-per-node": "Ranks per node",
    "--reduce-dtype": "Reduce gradients in", "--isolation": "Isolation",
    "--compile": "torch.compile", "--grad-checkpointing": "Gradient checkpointing",
    "--data": "Training data",
}
_FLAG = re.compile(r"--[a-z0-9-]+")
_FLAG_WITH_VALUE = re.compile(r"set (--[a-z0-9-]+) (\S+)")


def in_form_words(message: str) -> str:
    """An engine message with its CLI flags replaced by the form's field names."""
    message = _FLAG_WITH_VALUE.sub(
        lambda m: f'set "{FIELD_OF_FLAG.get(m[1], m[1])}" to {m[2]}', message)
    return _FLAG.sub(lambda m: f'"{FIELD_OF_FLAG[m[0]]}"' if m[0] in FIELD_OF_FLAG else m[0],
                     message)


DATA_TIP = (f"What the trials train and measure held-out loss on. Empty or {DATA_DOCS}: "
            "CPython's pydoc_data.topics, tokenised for the model. A file: UTF-8 text, "
            f"nanoGPT's uint16 .bin or a 1-D integer .npy of token ids. {DATA_RANDOM}: uniform "
            "random tokens, whose loss cannot fall below ln(vocab). The last 10% is held out.")
MAX_INT = 2**31 - 1  # the largest a QSpinBox holds
DEVICES = ("auto", "cpu", "cuda")
RUN_WHILE_PROBING = ("auto", "cpu")
RUN_OPTIMIZER = "(the run's optimizer)"
PROBE_FALLBACK_MS = 1500
HELP_LINES = 4  # the precision help's box; a longer text scrolls inside it


def describe(name: str) -> str:
    """"name: what it trains", one line; a ":keep-..." variant's line is its suffix's
    (written "FP8:keep-ends: ..." in the resource, which names the recipe itself)."""
    keep = split_keep(name)[1]
    text = precision_descriptions()[f":{keep}" if keep else name]
    return f"{name}: {text.partition(': ')[2] if keep else text}"


# the recipes' "compiled by default" clause (engine.core.recipes): float8 emulated on this
# device runs uncompiled (engine.core.recipes.compiles), so its hint says that instead
_COMPILED_CLAUSE = re.compile(r"[;,]? *(step )?\bcompiled( with torch\.compile)?( by default)?"
                              r"( \([^)]*\))?(?=$|[;,.])")


def uncompiled(description: str) -> str:
    """A precision's line as it runs emulated: without its claim to be compiled."""
    if not _COMPILED_CLAUSE.search(description):
        return description
    return _COMPILED_CLAUSE.sub("", description).rstrip(" ;,") + "; runs uncompiled here " \
        "(emulated float8 is slow either way)"


def _swatch(color: QColor) -> QIcon:
    pixmap = QPixmap(12, 12)
    pixmap.fill(color)
    return QIcon(pixmap)


def _spin(minimum: int, maximum: int, value: int) -> QSpinBox:
    box = QSpinBox()
    box.setRange(minimum, maximum)
    box.setValue(value)
    return box


class ConfigPanel(QWidget):
    changed = Signal()  # any edit
    validity_changed = Signal(bool)
    device_changed = Signal(object)  # DeviceInfo, or None when the device cannot be used
    engine_loaded = Signal()  # torch and transformers are loaded (in the probe's thread)

    def __init__(self, parent: QWidget | None = None, probe_on_paint: bool = True) -> None:
        super().__init__(parent)
        self._probe_on_paint = probe_on_paint
        self.device_info: DeviceInfo | None = None
        self.device_error: str | None = None
        self._probing: str | None = None  # the device asked about, until the probe answers
        self._probe = DeviceProbe(self)
        self._probe.answered.connect(self._on_probe_answer)
        self._probe.engine_loaded.connect(self.engine_loaded)
        # the probe starts after the first paint (see paintEvent) or when the owner calls
        # start_probe, or after this long when neither happens
        QTimer.singleShot(PROBE_FALLBACK_MS, self._probe.start)
        self._error: str | None = None
        defaults = RunConfig()

        # model source: preset / folder / hub id
        self.source = QComboBox()
        self.source.addItems(MODEL_SOURCES)
        self.preset = QComboBox()
        for preset in presets():
            self.preset.addItem(preset.name)
            self.preset.setItemData(
                self.preset.count() - 1, preset.description, Qt.ItemDataRole.ToolTipRole
            )
        self.folder = QLineEdit()
        self.folder.setPlaceholderText("folder with config.json")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse_folder)
        folder_row = QWidget()
        folder_layout = QHBoxLayout(folder_row)
        folder_layout.setContentsMargins(0, 0, 0, 0)
        folder_layout.addWidget(self.folder)
        folder_layout.addWidget(browse)
        self.hub_id = QLineEdit()
        self.hub_id.setPlaceholderText("e.g. gpt2 (from the local cache)")
        self.model_stack = QStackedWidget()
        for page in (self.preset, folder_row, self.hub_id):
            self.model_stack.addWidget(page)
        self.source.currentIndexChanged.connect(self.model_stack.setCurrentIndex)
        # what the trials train on: empty is the built-in text (RunConfig's default)
        self.data = QLineEdit()
        self.data.setPlaceholderText(f"{DATA_DOCS}: CPython's docs (or a file, or {DATA_RANDOM})")
        self.data.setToolTip(DATA_TIP)
        self.browse_data = QPushButton("Browse…")
        self.browse_data.clicked.connect(self._browse_data)
        data_row = QWidget()
        data_layout = QHBoxLayout(data_row)
        data_layout.setContentsMargins(0, 0, 0, 0)
        data_layout.addWidget(self.data)
        data_layout.addWidget(self.browse_data)
        self.trust_remote_code = QCheckBox("Trust remote code")
        self.trust_remote_code.setToolTip("Run Python code shipped with a hub or folder model")

        self.precisions = QListWidget()
        for name in FORM_PRECISIONS:
            item = QListWidgetItem(_swatch(precision_color(name)), name)
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setToolTip(describe(name))
            item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsUserCheckable)
            self.precisions.addItem(item)
        # ticked from default_precisions until the user (or their saved form) picks: again
        # each time the probe answers, for the device it found
        self._default_ticks = True
        self._tick_defaults(default_precisions())
        self.precisions.itemChanged.connect(self._precisions_picked)
        self.precisions.setMaximumHeight(self.precisions.sizeHintForRow(0) * 10)
        # the RECIPE+OPTIM axis: each ticked state runs beside every ticked recipe; the
        # first entry is the plain recipe, with the run's optimizer
        self.optim_states = QListWidget()
        for optim in ("", *STATE_OPTIMIZERS):
            item = QListWidgetItem(f"+{optim}" if optim else RUN_OPTIMIZER)
            item.setData(Qt.ItemDataRole.UserRole, optim)
            item.setToolTip(precision_descriptions()[f"+{optim}"] if optim else
                            "each ticked precision with the run's Optimizer (below)")
            item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Unchecked if optim else Qt.CheckState.Checked)
            self.optim_states.addItem(item)
        self.optim_states.setMaximumHeight(self.optim_states.sizeHintForRow(0) * 5)
        self.optim_states.setMouseTracking(True)
        self.optim_states.itemEntered.connect(self._describe_precision)
        self.optim_states.currentItemChanged.connect(self._describe_precision)
        # what the precision under the cursor (or the last one picked) trains, in a line
        self.precision_help = QLabel("Point at a precision to see what it trains.")
        self.precision_help.setTextFormat(Qt.TextFormat.PlainText)
        self.precision_help.setWordWrap(True)
        self.precisions.setMouseTracking(True)
        self.precisions.itemEntered.connect(self._describe_precision)
        self.precisions.currentItemChanged.connect(self._describe_precision)

        # no silent ceiling: a batch too big for the machine is refused at Run, with the
        # predicted memory against the free memory (engine.run.fits)
        self.batch_size = _spin(1, MAX_INT, defaults.batch_size)
        self.seq_len = _spin(1, 1 << 20, defaults.seq_len)
        self.steps = _spin(1, 1_000_000, defaults.steps)
        self.warmup = _spin(0, 100_000, defaults.warmup)
        self.grad_accum = _spin(1, 4096, defaults.grad_accum)
        self.optimizer = QComboBox()
        self.optimizer.addItems(OPTIMIZERS)
        self.grad_checkpointing = QCheckBox("Gradient checkpointing")
        self.compile = QCheckBox("torch.compile")
        self.init_scale = QDoubleSpinBox()
        self.init_scale.setRange(0.0, 2.0**40)
        self.init_scale.setDecimals(1)
        self.init_scale.setValue(defaults.init_scale)
        self.init_scale.setToolTip("GradScaler's starting loss scale (fp16 recipes)")
        self.growth_interval = _spin(1, 10_000_000, defaults.growth_interval)
        self.growth_interval.setToolTip("Steps without overflow before the loss scale doubles")
        self.device = QComboBox()
        self.device.addItems(DEVICES)
        self.isolation = QComboBox()
        self.isolation.addItems(ISOLATIONS)
        self.isolation.setToolTip(
            "process: each trial in a child process (clean memory numbers, crashes contained);"
            " inline: in this process (debugging)"
        )

        # distributed: torchrun ranks; the reduce dtype becomes each precision's "@dtype"
        self.strategy = QComboBox()
        self.strategy.addItems(STRATEGIES)
        self.strategy.setToolTip("none: one process; ddp or fsdp2: each trial under torchrun")
        self.nproc = _spin(1, 1024, defaults.nproc_per_node)
        self.nproc.setToolTip("torchrun --nproc-per-node: ranks on this machine (one GPU each)")
        self.reduce_dtype = QComboBox()
        self.reduce_dtype.addItems((REDUCE_AS_COMPUTED, *REDUCE_DTYPES))
        self.reduce_dtype.setToolTip("dtype gradients are reduced in: a DDP compression hook "
                                     "or FSDP2's reduce_dtype")

        self.interleave = QCheckBox("Interleave precisions (ABBA rounds) where cheap")
        self.interleave.setChecked(defaults.interleave != "off")
        self.interleave.setToolTip(
            f"Split each precision's steps over {defaults.rounds} rounds run in turn, every other "
            f"round reversed (fp32, bf16-amp, bf16-amp, fp32), so a machine that drifts slows "
            f"every precision alike. "
            f"Only where {CHEAP_RULE}; each round reloads the model and warms up again."
        )
        # the optional untimed work after (and before) the measured steps: its cost is per trial
        self.profile_step = QCheckBox("Kernel profile (one untimed profiled step)")
        self.profile_step.setChecked(defaults.profile_step)
        self.profile_step.setToolTip(
            "One extra step under torch.profiler per precision: time by kernel, dtype and "
            "category. Off: the run is shorter, the kernel table says n/a.")
        self.quant_error = QCheckBox("Quantisation error (one untimed SQNR forward)")
        self.quant_error.setChecked(defaults.quant_error)
        self.quant_error.setToolTip(
            "One extra forward per precision that measures each matmul layer's SQNR as the "
            "recipe rounds it. Off: the run is shorter, the SQNR columns say n/a.")

        self.error_label = QLabel()
        self.error_label.setTextFormat(Qt.TextFormat.PlainText)
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #C00000;")
        self.error_label.hide()

        model_box = QGroupBox("Model")
        model_form = QFormLayout(model_box)
        model_form.addRow("Source", self.source)
        model_form.addRow("Model", self.model_stack)
        model_form.addRow(self.trust_remote_code)
        precision_box = QGroupBox("Precisions")
        precision_layout = QVBoxLayout(precision_box)
        precision_layout.addWidget(self.precisions)
        precision_layout.addWidget(QLabel("Optimizer state (RECIPE+OPTIM), per precision"))
        precision_layout.addWidget(self.optim_states)
        # the help in a box of fixed height that scrolls: a longer description (an emulated
        # recipe's) must not move the list under the pointer, nor be cut
        help_box = QScrollArea()
        help_box.setWidgetResizable(True)
        help_box.setFrameShape(QFrame.Shape.NoFrame)
        help_box.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        help_box.setWidget(self.precision_help)
        help_box.setFixedHeight(self.precision_help.fontMetrics().lineSpacing() * HELP_LINES + 6)
        precision_layout.addWidget(help_box)
        train_box = QGroupBox("Training")
        form = QFormLayout(train_box)
        form.addRow("Training data", data_row)
        form.addRow("Batch size", self.batch_size)
        form.addRow("Sequence length", self.seq_len)
        form.addRow("Steps", self.steps)
        form.addRow("Warm-up steps", self.warmup)
        form.addRow("Grad accumulation", self.grad_accum)
        form.addRow("Optimizer", self.optimizer)
        form.addRow(self.grad_checkpointing)
        form.addRow(self.compile)
        form.addRow("Initial loss scale", self.init_scale)
        form.addRow("Growth interval", self.growth_interval)
        form.addRow("Device", self.device)
        form.addRow("Isolation", self.isolation)
        form.addRow("Strategy", self.strategy)
        form.addRow("Ranks per node", self.nproc)
        form.addRow("Reduce gradients in", self.reduce_dtype)
        form.addRow(self.interleave)
        form.addRow(self.profile_step)
        form.addRow(self.quant_error)

        layout = QVBoxLayout(self)
        layout.addWidget(model_box)
        layout.addWidget(precision_box)
        layout.addWidget(train_box)
        # error_label is placed by the window, next to the Run button
        layout.addStretch(1)

        for signal in (
            self.source.currentIndexChanged,
            self.preset.currentIndexChanged,
            self.folder.textChanged,
            self.hub_id.textChanged,
            self.trust_remote_code.toggled,
            self.data.textChanged,
            self.precisions.itemChanged,
            self.optim_states.itemChanged,
            self.batch_size.valueChanged,
            self.seq_len.valueChanged,
            self.steps.valueChanged,
            self.warmup.valueChanged,
            self.grad_accum.valueChanged,
            self.optimizer.currentIndexChanged,
            self.grad_checkpointing.toggled,
            self.compile.toggled,
            self.init_scale.valueChanged,
            self.growth_interval.valueChanged,
            self.isolation.currentIndexChanged,
            self.strategy.currentIndexChanged,
            self.nproc.valueChanged,
            self.reduce_dtype.currentIndexChanged,
            self.interleave.toggled,
        ):
            signal.connect(self._on_edit)
        self.device.currentIndexChanged.connect(self._on_device)
        self._on_device()

    # --- reading the form ---------------------------------------------------------

    def model_text(self) -> str:
        return (self.preset.currentText(), self.folder.text(), self.hub_id.text())[
            self.source.currentIndex()
        ].strip()

    def checked_precisions(self) -> list[str]:
        items = (self.precisions.item(i) for i in range(self.precisions.count()))
        return [
            item.data(Qt.ItemDataRole.UserRole)
            for item in items
            if item.checkState() == Qt.CheckState.Checked
        ]

    def checked_states(self) -> list[str]:
        """Ticked optimizer suffixes; "" is the plain recipe with the run's optimizer."""
        items = (self.optim_states.item(i) for i in range(self.optim_states.count()))
        return [item.data(Qt.ItemDataRole.UserRole) for item in items
                if item.checkState() == Qt.CheckState.Checked]

    def form_values(self) -> dict:
        """The form as RunConfig keyword arguments (not yet validated)."""
        reduce = self.reduce_dtype.currentText()
        suffix = "" if reduce == REDUCE_AS_COMPUTED else f"@{reduce}"
        return {
            "model": self.model_text(),
            "precisions": [p + (f"+{o}" if o else "") + suffix
                           for p in self.checked_precisions() for o in self.checked_states()],
            "batch_size": self.batch_size.value(),
            "seq_len": self.seq_len.value(),
            "steps": self.steps.value(),
            "warmup": self.warmup.value(),
            "grad_accum": self.grad_accum.value(),
            "optimizer": self.optimizer.currentText(),
            "grad_checkpointing": self.grad_checkpointing.isChecked(),
            "compile": self.compile.isChecked(),
            "init_scale": self.init_scale.value(),
            "growth_interval": self.growth_interval.value(),
            "device": self.device.currentText(),
            "isolation": self.isolation.currentText(),
            "trust_remote_code": self.trust_remote_code.isChecked(),
            "strategy": self.strategy.currentText(),
            "nproc_per_node": self.nproc.value(),
            "interleave": "auto" if self.interleave.isChecked() else "off",
            "profile_step": self.profile_step.isChecked(),
            "quant_error": self.quant_error.isChecked(),
            "data": self.data.text().strip() or DATA_DOCS,
        }

    def config(self) -> RunConfig:
        """The validated config; raises ``ValueError`` with the fix for bad input."""
        # the CPU (and auto, which the engine probes again when the run starts) need not
        # wait: a precision the device cannot run is then reported as unsupported
        if self._probing is not None and self._probing not in RUN_WHILE_PROBING:
            raise ValueError(f"{PROBING} Run is enabled once it answers")
        if self.device_error:
            raise ValueError(self.device_error)
        config = RunConfig(**self.form_values())
        check_model(config.model, config.seq_len, SOURCE_KINDS[self.source.currentIndex()])
        return config

    def error(self) -> str | None:
        return self._error

    # --- writing the form -----------------------------------------------------------

    def set_values(self, values: dict) -> None:
        """Fill the form from saved values; a key that is unknown, of the wrong type or out
        of its field's range keeps the field's default."""
        model = values.get("model")
        if isinstance(model, str) and model:
            if self.preset.findText(model) >= 0:
                self.source.setCurrentIndex(0)
                self.preset.setCurrentText(model)
            elif values.get("model_source") == MODEL_SOURCES[1]:
                self.source.setCurrentIndex(1)
                self.folder.setText(model)
            else:
                self.source.setCurrentIndex(2)
                self.hub_id.setText(model)
        listed = values.get("precisions")
        if isinstance(listed, list) and all(isinstance(p, str) for p in listed):
            self._default_ticks = False  # the saved pick stands, whatever the device
            wanted = {split_label(p)[0] for p in listed}
            states = {split_label(p)[1] or "" for p in listed}
            for i in range(self.optim_states.count()):
                item = self.optim_states.item(i)
                item.setCheckState(Qt.CheckState.Checked if item.data(Qt.ItemDataRole.UserRole)
                                   in states else Qt.CheckState.Unchecked)
            reduce = {p.partition("@")[2] or REDUCE_AS_COMPUTED for p in listed}
            if len(reduce) == 1 and self.reduce_dtype.findText(next(iter(reduce))) >= 0:
                self.reduce_dtype.setCurrentText(next(iter(reduce)))
            for i in range(self.precisions.count()):
                item = self.precisions.item(i)
                if item.flags() & Qt.ItemFlag.ItemIsEnabled:
                    name = item.data(Qt.ItemDataRole.UserRole)
                    item.setCheckState(
                        Qt.CheckState.Checked if name in wanted else Qt.CheckState.Unchecked
                    )
        spins = {
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "steps": self.steps,
            "warmup": self.warmup,
            "grad_accum": self.grad_accum,
            "growth_interval": self.growth_interval,
            "init_scale": self.init_scale,
            "nproc_per_node": self.nproc,
        }
        for key, box in spins.items():
            value = values.get(key)
            if (isinstance(value, int | float) and not isinstance(value, bool)
                    and box.minimum() <= value <= box.maximum()
                    and (key == "init_scale" or isinstance(value, int))):
                box.setValue(value)
        for key, box in (("grad_checkpointing", self.grad_checkpointing),
                         ("compile", self.compile),
                         ("trust_remote_code", self.trust_remote_code),
                         ("profile_step", self.profile_step),
                         ("quant_error", self.quant_error)):
            if isinstance(values.get(key), bool):
                box.setChecked(values[key])
        if isinstance(values.get("data"), str):
            self.data.setText("" if values["data"] == DATA_DOCS else values["data"])
        if values.get("interleave") in ("auto", "on", "off"):
            self.interleave.setChecked(values["interleave"] != "off")
        for key, combo in (("optimizer", self.optimizer), ("isolation", self.isolation),
                           ("device", self.device), ("strategy", self.strategy)):
            if isinstance(values.get(key), str) and combo.findText(values[key]) >= 0:
                combo.setCurrentText(values[key])
        self._on_edit()

    def saved_values(self) -> dict:
        return {**self.form_values(), "model_source": self.source.currentText()}

    # --- reactions --------------------------------------------------------------------

    def _browse_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Model folder", self.folder.text())
        if folder:
            self.folder.setText(folder)

    def _browse_data(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Training data", self.data.text(),
                                              "Text or token ids (*.txt *.bin *.npy);;All (*)")
        if path:
            self.data.setText(path)

    def paintEvent(self, event) -> None:
        super().paintEvent(event)
        if self._probe_on_paint:  # the window is on screen: now torch may load
            QTimer.singleShot(0, self._probe.start)

    def start_probe(self) -> None:
        """Let torch load in the probe's thread (it holds the GIL for long stretches)."""
        self._probe.start()

    def device_pending(self) -> bool:
        """True while the device probe has not answered for the chosen device."""
        return self._probing is not None

    def _on_device(self) -> None:
        self._probing = self.device.currentText()
        self.device_info = None
        self.device_error = None
        self._probe.request(self._probing)
        self.device_changed.emit(None)
        self._on_edit()

    def _on_probe_answer(self, device: str, info: DeviceInfo | None, error: str | None) -> None:
        if device != self._probing:
            return  # an answer about a device no longer chosen
        self._probing = None
        self.device_info = info
        self.device_error = error
        if self._default_ticks and info is not None:
            self._tick_defaults(default_precisions(info))
        self._grey_out_unsupported()
        self.device_changed.emit(self.device_info)
        self._on_edit()

    def _tick_defaults(self, names: tuple[str, ...]) -> None:
        blocked = self.precisions.blockSignals(True)  # not the user's pick
        for i in range(self.precisions.count()):
            item = self.precisions.item(i)
            item.setCheckState(Qt.CheckState.Checked if item.data(Qt.ItemDataRole.UserRole)
                               in names else Qt.CheckState.Unchecked)
        self.precisions.blockSignals(blocked)

    def _precisions_picked(self, *_args) -> None:
        self._default_ticks = False

    def _describe_precision(self, item: QListWidgetItem | None, *_previous) -> None:
        if item is not None:
            self.precision_help.setText(item.toolTip())

    def _grey_out_unsupported(self) -> None:
        self.precisions.blockSignals(True)
        for i in range(self.precisions.count()):
            item = self.precisions.item(i)
            name = item.data(Qt.ItemDataRole.UserRole)
            what = describe(name)
            verdict = self.device_info.verdict(name) if self.device_info else None
            # the device's own list also holds what is not installed (bitsandbytes, torchao)
            reason = self.device_info.unsupported_reason(name) if self.device_info else None
            emulated = reason is None and verdict is not None and verdict.support == "emulated"
            font = item.font()
            font.setItalic(emulated)
            item.setFont(font)
            item.setText(f"{name} (emulated)" if emulated else name)
            if reason:
                item.setFlags(Qt.ItemFlag.NoItemFlags)
                item.setCheckState(Qt.CheckState.Unchecked)
                item.setToolTip(f"{what}\n{name} cannot run here: {reason}")
            else:
                item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsUserCheckable)
                item.setToolTip(f"{uncompiled(what)}\n{name} runs emulated here: "
                                f"{verdict.reason}" if emulated else what)
        self.precisions.blockSignals(False)

    def _on_edit(self, *_args) -> None:
        try:
            self.config()
            error = None
        except ValueError as exc:
            error = in_form_words(str(exc))
        was_valid = self._error is None
        self._error = error
        note = (f"{PROBING} precisions this device cannot run are greyed when it answers"
                if error is None and self._probing is not None else None)
        self.error_label.setText(error or note or "")
        # waiting for the probe is no mistake of the user's: grey, not red
        self.error_label.setStyleSheet(
            "color: #777777;" if self._probing is not None else "color: #C00000;")
        self.error_label.setVisible(error is not None or note is not None)
        if was_valid != (error is None):
            self.validity_changed.emit(error is None)
        self.changed.emit()
