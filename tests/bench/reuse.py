"""What a benchmark made in an earlier run and keeps in its work folder (weights, packed
data: minutes to make) is used again only as make would use a target."""
import os


def reuse(path, *made_from):
    """Whether PATH, which an earlier run of the benchmark made, is used again: only where it
    is newer than every file it was made from (the tool that wrote it among them); otherwise
    it is removed, to be made afresh."""
    if os.path.exists(path) and all(os.path.getmtime(path) > os.path.getmtime(f) for f in made_from):
        return True
    if os.path.exists(path):
        os.remove(path)
    return False
