"""``python -m core rpe``: a T5 model's relative-position-bias curves b(m, n) per head for one query m (the paper's
Figure 1), written as one CSV.
"""

from __future__ import annotations

import numpy as np

from core.cli.model import load_model
from core.errors import UserError
from core.values.validation import RpeLength, validate


def command(args) -> int:
    import pandas as pd

    from core.views.rpe import bias_curves

    loaded = load_model(args.model, args.train_length, tokenizer=args.tokenizer)
    lt = loaded.train_length
    length = args.length if args.length is not None else 4 * lt
    validate(RpeLength, length, f"rpe length (default 4 x L_tr = {length:,}; pass --length)")
    m = args.query if args.query is not None else min(lt // 2, length - 1)
    if m >= length:
        raise UserError(f"--query {m} must be below the length {length:,}")
    try:
        curves = bias_curves(loaded.model, m, length)
    except ValueError as err:
        raise UserError(f"rpe: {err}") from None
    df = pd.DataFrame({"n": np.arange(length), "distance": np.arange(length) - m})
    for h, c in enumerate(curves):
        df[f"head{h}"] = c
    from core.experiments import csvio

    csvio.write_csv(df, args.out)  # replaced whole, under the lock sweeps hold on the real file
    print(f"wrote {args.out}: {curves.shape[0]} heads x {length} keys, query m={m}, L_tr={lt}")
    return 0
