"""Quality you can gate on: does a placement, cache type, quant or transport change the answers?

- :mod:`.perplexity_output`: llama-perplexity's output, parsed (pure; one grammar per log era);
- :mod:`.stats`: per-chunk values, bootstrap and Wilson intervals, McNemar's exact test, verdicts (pure);
- :mod:`.kld`: runs llama-perplexity with each plan's own flags, the reference's logits saved once;
- :mod:`.qa`: multiple-choice questions (pure: formats, prompts, the answer rule);
- :mod:`.soak`: asks a server the questions and stores each answer.
"""
