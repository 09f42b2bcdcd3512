"""What a person looks at, from plain arrays: the scrubber's frames (bytes the browser redraws), plotly figures,
method tables, the rotary models' views (masked-token cards, distance curves, a scheme's mask over the map) and T5's
relative-bias curves. Each takes a run's recorded numbers (or, for the curves, the model's own weights) and
draws; none of them changes a run.
"""
