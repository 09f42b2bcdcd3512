"""Does any head look up the asked line? Attention mass on the asked line versus the others.

    python research/line_attention.py [--model NAME_OR_FOLDER] [--length 256] [--samples 30]

Line retrieval needs an associative lookup: something must attend from the
question's label to the line with the same label. For LongChat line
documents (seeds 1000.., tau = 1) this prints, per layer and head, the
attention mass that (a) the encoder's question rows and (b) the decoder's
first cross-attention step put on the asked line's tokens, next to the mean
mass on any other line. A head that matches labels shows a large ratio; a
position prior shows none. The write-up in docs/line-retrieval.md
uses it. Uses transformers' eager attention to get the weights, so only
dot-product (not cosine) models.
"""

from __future__ import annotations

import argparse
import re
import sys

import numpy as np
import torch

from core.data import tasks
from core.models import default_model, resolve

LINE = re.compile(r"line ([a-z0-9-]+): REGISTER_CONTENT is \d+")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="bundled name or folder (default: the default model)")
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--samples", type=int, default=30)
    a = ap.parse_args()
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    path = resolve(a.model or default_model()).source
    tok = AutoTokenizer.from_pretrained(path)
    model = T5ForConditionalGeneration.from_pretrained(path, attn_implementation="eager").eval()
    if getattr(model.config, "cosine_attention", False):
        sys.exit("line_attention: cosine-attention models need core's attention; eager weights would be wrong")
    cfg = model.config
    mass = {k: np.zeros((n, cfg.num_heads)) for k, n in
            (("enc_asked", cfg.num_layers), ("enc_other", cfg.num_layers),
             ("cross_asked", cfg.num_decoder_layers), ("cross_other", cfg.num_decoder_layers))}
    for seed in range(1000, 1000 + a.samples):
        doc = tasks.make("line", tok, a.length, seed=seed)
        enc = tok(doc.text, return_offsets_mapping=True)
        off = enc["offset_mapping"]

        def tokens(lo: int, hi: int) -> list[int]:
            return [i for i, (x, y) in enumerate(off) if x >= lo and y <= hi and y > x]

        q0, q1 = doc.question_span
        question = tokens(q0, q1)
        lines = [(m.group(1), tokens(m.start(), m.end())) for m in LINE.finditer(doc.text[:q0])]
        with torch.no_grad():
            out = model(input_ids=torch.tensor([enc["input_ids"]]), decoder_input_ids=torch.tensor([[0]]),
                        output_attentions=True)
        others = len(lines) - 1
        for label, toks in lines:
            asked = label == doc.meta["line_index"]
            for layer, att in enumerate(out.encoder_attentions):
                w = att[0][:, question][:, :, toks].sum(-1).mean(-1).numpy()
                mass["enc_asked" if asked else "enc_other"][layer] += w if asked else w / others
            for layer, att in enumerate(out.cross_attentions):
                w = att[0][:, 0, toks].sum(-1).numpy()
                mass["cross_asked" if asked else "cross_other"][layer] += w if asked else w / others
    np.set_printoptions(precision=3, suppress=True)
    print(f"{path}: {a.samples} line documents of {a.length} tokens, mean attention mass per layer (rows) and head (columns)")
    for where, what in (("enc", "encoder, question rows"), ("cross", "decoder, first step's cross-attention")):
        print(f"\n{what} -> the asked line\n{mass[where + '_asked'] / a.samples}")
        print(f"{what} -> another line (mean)\n{mass[where + '_other'] / a.samples}")


if __name__ == "__main__":
    main()
