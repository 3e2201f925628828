//! Fencing on the protected side (work in progress).
