//! Placement: the replicated cluster map and the pure planner (work in progress).
