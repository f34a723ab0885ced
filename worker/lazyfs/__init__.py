"""Images mounted lazily over FUSE: files merged from layers, chunks fetched on first read.

tree.py      the inode table (pure): merged layers + mount-point placeholders
content.py   file ranges from chunks (RAM tier → disk cache → store), access order
fs.py        the pyfuse3 operations (read-only)
serve.py     the mount process: mount, prefetch the profile, control socket
config.py    MountConfig / MountStats and the control protocol
mount.py     the worker's side: start a mount process, ask it, unmount it
"""
