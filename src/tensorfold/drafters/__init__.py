"""Drafters: where proposed tokens come from (base.py: what each implements). A drafter only
guesses; the engine's verify passes decide every token, so a drafter changes speed, never output."""
