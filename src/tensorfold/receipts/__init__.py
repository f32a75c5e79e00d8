"""Receipts: speed and exactness measured through the OpenAI API of any server (ours or a
peer's), the teacher-forced fidelity judge, and the attention precision check."""
