"""What tests in several folders share, beyond tests/conftest.py's fixtures: a real browser (:mod:`support.browser`),
AppTest pages (:mod:`support.app`), a hub that is not there (:mod:`support.hub`), reference attentions
(:mod:`support.reference`). Imported as ``support`` (pytest.ini puts tests/ on the path).
"""
