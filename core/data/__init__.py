"""The text the models read: the held-out prose corpus and the task generators and scorers (pass key, line,
topic, multi-document QA, code, language modelling, your own text). Plain Python; no torch.
"""
