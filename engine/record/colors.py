"""One colour per precision, the same in every chart, table and report.

Qt-free so the report writers and the window share it. The first seven are the
Okabe-Ito palette (distinguishable with the common colour-vision deficiencies) minus
black and yellow, which vanish on dark and light backgrounds respectively; the last
two come from Paul Tol's muted palette and a neutral grey; the float8 rowwise
recipes and the block-scaled ones (mxfp8, nvfp4) take four more of Tol's muted colours.
"""

from __future__ import annotations

PRECISION_COLORS: dict[str, str] = {
    "fp32": "#0072B2",  # blue: the baseline
    "tf32": "#56B4E9",  # sky blue: fp32's sibling
    "fp16-amp": "#E69F00",  # orange
    "bf16-amp": "#009E73",  # bluish green
    "fp16": "#D55E00",  # vermillion
    "bf16": "#CC79A7",  # reddish purple
    "int8": "#882255",  # wine
    "nf4": "#999933",  # olive
    "fp8": "#777777",  # grey
    "fp8-rowwise": "#44AA99",  # teal (Tol muted)
    "fp8-rowwise-gw-hp": "#332288",  # indigo (Tol muted)
    "mxfp8": "#AA4499",  # purple (Tol muted)
    "nvfp4": "#117733",  # green (Tol muted)
    "fp8-fsdp-ag": "#DDCC77",  # sand (Tol muted)
}

_REDUCE_TINT = {"bf16": 0.35, "fp16": 0.55, "fp32": 0.15}  # share of white mixed in
# a "recipe:keep-..." label (layers kept in bf16): lighter still, beside its recipe
_KEEP_TINT = {"keep-ends": 0.2, "keep-attn": 0.3, "auto": 0.4}
# a "recipe+optim" label: its recipe's colour darkened by a share of black per optimizer
_OPTIM_SHADE = {"adamw": 0.1, "sgd": 0.2, "adamw8bit": 0.3, "adamw8bit-ao": 0.4,
                "adamw4bit": 0.55, "adamw-fp8": 0.45, "adamw-bf16-sr": 0.25}


def color_of(label: str, default: str = "#444444") -> str:
    """Colour of a precision label. A distributed "base@dtype" label (gradients reduced in
    dtype) takes its base precision's colour lightened by a fixed share per dtype: beside
    its base, yet told apart from it."""
    base, _, reduce = label.partition("@")
    base, _, optim = base.partition("+")
    base, _, keep = base.partition(":")
    color = PRECISION_COLORS.get(base)
    if color is None:
        return default
    tint = _REDUCE_TINT.get(reduce, 0.0) + _KEEP_TINT.get(keep, 0.0)
    shade = _OPTIM_SHADE.get(optim, 0.0)
    rgb = [int(color[i:i + 2], 16) * (1 - shade) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * tint):02X}" for c in rgb)
