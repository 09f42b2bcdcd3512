"""Many runs at once: sweeps over length and depth, batch runs over your documents, perplexity (the paper's
Table 3), masked-token evaluation of rotary models, the Ray cluster engine and the one-writer CSV they share.
"""
