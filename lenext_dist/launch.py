"""The old name of `lenext_dist.cluster` (renamed so that `launch/` names one thing: the entry
points at the top of the repository). `python -m lenext_dist.launch ...` is refused with the new
spelling; the commands are unchanged."""
import sys

if __name__ == "__main__":
    print("error: `python -m lenext_dist.launch` is now `python -m lenext_dist.cluster` "
          "(same commands and options); update the job script", file=sys.stderr)
    sys.exit(2)
