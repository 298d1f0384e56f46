"""The passkey evaluation's wording (the Landmark-attention / LongLoRA prompt), in one place.

Two stages read it: the evaluation builds its prompts from it (lenext_dist/eval/passkey.py), and
the task generators keep every one of its words out of their templates (prep/tasks.py), so a
passkey score never measures a memorized template. It lives in prep, the lower of the two, so
prep never imports eval (imports run one way along the pipeline).
"""
import re

PREFIX = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
          "memorize it. I will quiz you about the important information there.")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"

# its words, lower-case: no generator template may use one
TAKEN_WORDS = frozenset(re.findall(r"[a-z]+", " ".join((PREFIX, FILLER, KEY, QUESTION)).lower()))
