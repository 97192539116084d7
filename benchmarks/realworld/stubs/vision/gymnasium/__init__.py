"""A stand-in CartPole for the RL examples: 4-float states from a seeded generator, episodes of
20 steps, and a reward threshold of 15 so ``running_reward > threshold`` ends training after
about 15 episodes."""
from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np


class _CartPole:
    def __init__(self, render_mode=None):
        self.spec = SimpleNamespace(reward_threshold=15.0)
        self.action_space = SimpleNamespace(n=2)
        self.observation_space = SimpleNamespace(shape=(4,))
        self._rng, self._t = random.Random(0), 0

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng = random.Random(seed)
        self._t = 0
        return np.array([self._rng.uniform(-0.05, 0.05) for _ in range(4)]), {}

    def step(self, action):
        self._t += 1
        state = np.array([self._rng.uniform(-1, 1) + 0.1 * action for _ in range(4)])
        return state, 1.0, self._t >= 20, False, {}

    def render(self):
        pass

    def close(self):
        pass


def make(name, render_mode=None, **kwargs):
    return _CartPole(render_mode)
