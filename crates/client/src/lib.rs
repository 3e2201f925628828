//! fencelock client (work in progress).
