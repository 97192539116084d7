"""``distify verify``: run a script and its conversion side by side and check the conversion
(:mod:`.session` makes the runs of :mod:`.runs` and the checks of :mod:`.checks`; :mod:`.hooks`
instruments every process of a run)."""
