"""Node-side rules for Ray's temp dir; stdlib only, shipped with the node script and judged on the node itself.

Ray makes its temp dir and the folders it creates there (`sockets`, `logs`, `runtime_resources/...`) mode 0777
without the sticky bit, so anyone who can reach the temp dir can swap a job's cached code and have it run as the
cluster's owner. What keeps other local users out is the folder that holds the temp dir: it must be ours and closed
to everyone else (0700, as `up` creates it). Every folder above it must be ours or root's, and one that others may
write must have the sticky bit (as /tmp has), so that no one can move ours away and put their own in its place.
The temp dir itself must be ours; its mode is Ray's.
"""

import os
import pwd
import stat


def _owner(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _about(path, st):
    return f"{path} (owner {_owner(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o})"


def _prefixes(path):
    """'/a/b/c' -> ['/a', '/a/b', '/a/b/c']."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def temp_dir_problem(temp_dir, uid=None):
    """[what, fix] when `temp_dir` is not safe for a Ray of this user here, else None. A folder that does not exist
    yet is no problem: `up` creates it (prepare_temp_dir)."""
    uid = os.getuid() if uid is None else uid
    trusted = (0, uid)
    for p in _prefixes(temp_dir):  # a symlink on the way counts as its owner's folder
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in trusted:
            return [f"{p} is a symlink owned by {_owner(st.st_uid)}: they choose where Ray's temp dir goes",
                    f"point ray.temp_dir at a path without it, e.g. /tmp/vc-{uid}/<cluster>"]
    real = os.path.realpath(temp_dir)
    parent = os.path.dirname(real)
    fix_parent = (f"put ray.temp_dir in a folder only you can enter (leave it out for /tmp/vc-{uid}/<cluster>, "
                  "whose parent `up` creates 0700)")
    for p in _prefixes(parent)[:-1]:
        try:
            st = os.stat(p)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return [f"{_about(p, st)} is not a folder", "fix ray.temp_dir"]
        if st.st_uid not in trusted:
            return [f"{_about(p, st)} belongs to another user, who can replace the folders in it", fix_parent]
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return [f"{_about(p, st)} is writable by others without the sticky bit: they can replace the folders "
                    "in it", fix_parent]
    try:
        st = os.stat(parent)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return [f"{_about(parent, st)} is not a folder", "fix ray.temp_dir"]
    if st.st_mode & stat.S_ISVTX:
        return [f"the temp dir's parent {_about(parent, st)} is a folder users share: Ray makes the temp dir "
                "writable by everyone, so its parent must keep others out", fix_parent]
    if st.st_uid != uid:
        return [f"the temp dir's parent {_about(parent, st)} is not yours: Ray makes the temp dir writable by "
                "everyone, so its parent must keep others out", fix_parent if st.st_uid in trusted else
                f"remove {parent} (it was made by {_owner(st.st_uid)}: check it), or set ray.temp_dir elsewhere"]
    if st.st_mode & 0o077:
        return [f"the temp dir's parent {_about(parent, st)} lets others in: Ray makes the temp dir writable by "
                "everyone, so its parent must be yours alone",
                f"chmod 700 {parent} (after checking that nothing in it was changed by others), or remove it and "
                "let `up` make it"]
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return [f"{_about(real, st)} is not a folder", "remove it, or set ray.temp_dir elsewhere"]
    if st.st_uid != uid:
        return [f"the temp dir {_about(real, st)} is not yours: its owner can run code as you through it",
                f"remove {real} (check what is in it), or set ray.temp_dir elsewhere"]
    return None


def prepare_temp_dir(temp_dir):
    """Create what is missing of `temp_dir`, each new folder 0700, unless what is there already is refused; then
    judge the result (another user's folder made meanwhile stays theirs, and is refused): [what, fix] or None."""
    problem = temp_dir_problem(temp_dir)
    if problem:
        return problem
    real = os.path.realpath(temp_dir)
    for p in _prefixes(real):
        if os.path.lexists(p):
            continue
        try:
            os.mkdir(p, 0o700)
            os.chmod(p, 0o700)  # mkdir's mode goes through the umask
        except FileExistsError:
            pass
        except OSError as e:
            return [f"cannot create {p}: {e.strerror or e}", "check ray.temp_dir and that you may write there"]
    return temp_dir_problem(temp_dir)
