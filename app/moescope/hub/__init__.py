"""Get models from the Hugging Face Hub, with the MoE fit checked before the download.

Choosing the file is where MoE users go wrong: whether a quant of an 80B MoE runs on a
24 GB card depends on how its bytes split between experts and the rest. So a repository's
GGUF files are listed (split files as one model), each file's header alone is read with
HTTP range requests (a few MB of a 50 GB file), and the same fit the Open dialog shows
(:mod:`moescope.display.fit`) is computed from it before anything is downloaded.

No Qt here: ``moescope pull`` (:mod:`moescope.cli.commands.pull`) and the *Get models*
window (:mod:`moescope.gui.hub`) word what this computes. Every request goes through
``huggingface_hub``'s shared HTTP session and headers, so ``HF_ENDPOINT``, proxies
(``HTTPS_PROXY``) and tokens (``HF_TOKEN``, or one given explicitly) work as they do for
the Hub's own tools.
"""
