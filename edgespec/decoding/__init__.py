"""The decode loop: plan → pack → verify → commit (``decoder``), the lossless
verification rules (``verify``), sampling, step events, detokenising and stop strings (``text``),
and answering a chat (``chat``)."""
