//! The planner: balance and drain plans, checked by executing them with
//! `simulate` and looking at every intermediate view.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_placement::*;
use proptest::prelude::*;

fn nodes(n: u64) -> Vec<(u64, String)> {
    (1..=n).map(|i| (i, format!("10.0.0.{i}:7000"))).collect()
}

fn spread(counts: &BTreeMap<u64, usize>) -> usize {
    let max = counts.values().max().copied().unwrap_or(0);
    let min = counts.values().min().copied().unwrap_or(0);
    max - min
}

/// Executes `plan` step by step with `simulate`, checking after every step
/// what the planner promises: the replica count of every shard is kept, and
/// no shard loses replicas on accepting nodes (so none that had a majority
/// drops below it).
fn execute(view: &ClusterView, plan: &[Action]) -> ClusterView {
    assert!(plan.len() <= MAX_ACTIONS_PER_PLAN);
    let mut at = view.clone();
    for action in plan {
        let next = simulate(&at, action).unwrap_or_else(|e| panic!("{action:?} refused: {e}"));
        for (id, shard) in &at.shards {
            assert_eq!(
                next.shards[id].replicas.len(),
                shard.replicas.len(),
                "{action:?}"
            );
            let (before, after) = (at.live_replicas(*id), next.live_replicas(*id));
            assert!(
                after >= before,
                "{action:?} took shard {id} from {before} to {after} live replicas"
            );
            if before >= at.majority() {
                assert!(after >= next.majority());
            }
        }
        at = next;
    }
    at
}

/// Every shard on nodes 1..=3 and led by node 1, in a cluster of `n` nodes.
fn skewed_view(n: u64, data_shards: u64) -> ClusterView {
    ClusterView {
        nodes: (1..=n).map(|i| (i, NodeState::Up)).collect(),
        down: BTreeSet::new(),
        shards: (0..=data_shards)
            .map(|id| {
                (
                    id,
                    ShardView {
                        replicas: [1, 2, 3].into(),
                        leader: Some(1),
                    },
                )
            })
            .collect(),
        replication_factor: 3,
    }
}

/// A bootstrapped cluster of `n - 1` nodes (first replica leads) that just
/// gained node `n`.
fn fresh_node_view(n: u64, data_shards: u32) -> ClusterView {
    let mut map = PlacementMap::bootstrap(&nodes(n - 1), data_shards, 3).unwrap();
    map.apply(&PlacementCommand::AddNode {
        node_id: n,
        addr: format!("10.0.0.{n}:7000"),
    })
    .unwrap();
    let leaders = map
        .shards()
        .map(|s| (s.shard_id, *s.replicas.first().unwrap()))
        .collect();
    ClusterView::from_map(&map, &leaders)
}

fn assert_balanced(view: &ClusterView, what: &str) {
    assert!(
        spread(&view.replica_counts()) <= 1,
        "{what}: replicas {:?}",
        view.replica_counts()
    );
    assert!(
        spread(&view.leader_counts()) <= 1,
        "{what}: leaders {:?}",
        view.leader_counts()
    );
    assert_eq!(
        plan_balance(view),
        vec![],
        "{what}: planning again moved something"
    );
}

#[test]
fn balance_evens_replicas_and_leaders_for_3_to_7_nodes_and_8_to_64_shards() {
    for n in 3..=7u64 {
        for shards in 8..=64u64 {
            for (start, name) in [
                (skewed_view(n, shards), "skewed"),
                (fresh_node_view(n, shards as u32), "fresh node"),
            ] {
                let plan = plan_balance(&start);
                assert_eq!(plan_balance(&start), plan, "plans are deterministic");
                let end = execute(&start, &plan);
                assert_balanced(&end, &format!("{name}, {n} nodes, {shards} shards"));
            }
        }
    }
}

#[test]
fn draining_a_node_leaves_it_with_no_replicas_and_no_leaderships() {
    for n in 4..=7u64 {
        for shards in [8u32, 31, 64] {
            let start = execute(
                &fresh_node_view(n, shards),
                &plan_balance(&fresh_node_view(n, shards)),
            );
            for drained in 1..=n {
                let mut view = start.clone();
                view.nodes.insert(drained, NodeState::Draining);
                let plan = plan_drain(&view, drained).unwrap();
                let end = execute(&view, &plan);
                for (id, shard) in &end.shards {
                    assert!(
                        !shard.replicas.contains(&drained),
                        "shard {id} still on {drained}"
                    );
                    assert_ne!(
                        shard.leader,
                        Some(drained),
                        "shard {id} still led by {drained}"
                    );
                    assert_eq!(shard.replicas.len(), 3);
                }
                // The meta shard moves like any other.
                assert!(!end.shards[&META_SHARD_ID].replicas.contains(&drained));
                // Balancing afterwards evens the others and gives it nothing.
                let after = execute(&end, &plan_balance(&end));
                assert!(spread(&after.replica_counts()) <= 1);
                assert!(after
                    .shards
                    .values()
                    .all(|s| !s.replicas.contains(&drained)));
            }
        }
    }
}

#[test]
fn a_drain_moves_leaderships_before_data() {
    let view = execute(
        &fresh_node_view(5, 16),
        &plan_balance(&fresh_node_view(5, 16)),
    );
    let plan = plan_drain(&view, 2).unwrap();
    let first_move = plan
        .iter()
        .position(|a| matches!(a, Action::MoveReplica { .. }))
        .unwrap();
    assert!(first_move > 0, "node 2 led something");
    assert!(plan[first_move..]
        .iter()
        .all(|a| matches!(a, Action::MoveReplica { .. })));
}

#[test]
fn a_drain_is_refused_whole_when_too_few_up_nodes_remain() {
    // Three nodes, factor three: nowhere to go.
    let view = skewed_view(3, 8);
    assert_eq!(
        plan_drain(&view, 2),
        Err(PlacementError::CannotDrain {
            node_id: 2,
            shard_id: 0,
            up_nodes: 2
        })
    );
    // Four nodes, but the spare one is down.
    let mut view = skewed_view(4, 8);
    view.down.insert(4);
    assert!(matches!(
        plan_drain(&view, 1),
        Err(PlacementError::CannotDrain { .. })
    ));
    assert_eq!(
        plan_drain(&view, 9),
        Err(PlacementError::UnknownNode { node_id: 9 })
    );
}

#[test]
fn nodes_not_up_or_observed_down_receive_nothing() {
    let mut view = skewed_view(6, 20);
    view.nodes.insert(4, NodeState::Draining);
    view.nodes.insert(5, NodeState::Drained);
    view.down.insert(6);
    // Only nodes 1..=3 accept, and they hold every shard: only leaders move.
    let plan = plan_balance(&view);
    assert!(
        plan.iter()
            .all(|a| matches!(a, Action::TransferLeader { to: 1..=3, .. })),
        "{plan:?}"
    );
    let end = execute(&view, &plan);
    assert_eq!(
        end.leader_counts(),
        BTreeMap::from([(1, 7), (2, 7), (3, 7)])
    );
    view.down.clear();
    let end = execute(&view, &plan_balance(&view));
    assert_eq!(end.replica_counts()[&6], 15);
    assert!(end
        .shards
        .values()
        .all(|s| !s.replicas.contains(&4) && !s.replicas.contains(&5)));
}

#[test]
fn simulate_refuses_unsafe_actions() {
    let mut view = skewed_view(6, 2);
    view.nodes.insert(4, NodeState::Draining);
    view.down.insert(5);
    let refused = |action: Action| simulate(&view, &action).unwrap_err();
    let mv = |from, to| Action::MoveReplica {
        shard_id: 1,
        from,
        to,
    };
    let lead = |to| Action::TransferLeader { shard_id: 1, to };
    assert_eq!(
        refused(mv(1, 2)),
        PlacementError::AlreadyAReplica {
            shard_id: 1,
            node_id: 2
        }
    );
    assert_eq!(
        refused(mv(6, 4)),
        PlacementError::NotAReplica {
            shard_id: 1,
            node_id: 6
        }
    );
    assert_eq!(
        refused(mv(1, 4)),
        PlacementError::NodeNotUp {
            node_id: 4,
            state: NodeState::Draining
        }
    );
    assert_eq!(refused(mv(1, 5)), PlacementError::NodeDown { node_id: 5 });
    assert_eq!(
        refused(mv(1, 9)),
        PlacementError::UnknownNode { node_id: 9 }
    );
    assert_eq!(
        refused(Action::MoveReplica {
            shard_id: 7,
            from: 1,
            to: 6
        }),
        PlacementError::UnknownShard { shard_id: 7 }
    );
    assert_eq!(
        refused(lead(6)),
        PlacementError::NotAReplica {
            shard_id: 1,
            node_id: 6
        }
    );
    assert_eq!(
        refused(lead(1)),
        PlacementError::AlreadyLeader {
            shard_id: 1,
            node_id: 1
        }
    );
    let mut leaderless = view.clone();
    leaderless.shards.get_mut(&1).unwrap().leader = None;
    assert_eq!(
        simulate(&leaderless, &lead(2)),
        Err(PlacementError::NoLeader { shard_id: 1 })
    );
    // A move off the leader hands leadership to the new replica.
    let moved = simulate(&skewed_view(4, 2), &mv(1, 4)).unwrap();
    assert_eq!(moved.shards[&1].leader, Some(4));
    assert_eq!(moved.shards[&1].replicas, [2, 3, 4].into());
}

#[test]
fn a_plan_is_bounded_and_planning_again_finishes_the_job() {
    // Every shard on three of 64 nodes: about 2,900 replica moves.
    let mut view = skewed_view(MAX_NODES as u64, u64::from(MAX_BOOTSTRAP_SHARDS));
    let mut rounds = 0;
    loop {
        let plan = plan_balance(&view);
        if plan.is_empty() {
            break;
        }
        if rounds == 0 {
            assert_eq!(
                plan.len(),
                MAX_ACTIONS_PER_PLAN,
                "the first plan is cut at the bound"
            );
        }
        view = execute(&view, &plan);
        rounds += 1;
        assert!(rounds < 10, "replanning does not converge");
    }
    assert!(rounds >= 2);
    assert_balanced(&view, "after replanning");
}

#[test]
fn an_inconsistent_view_gets_no_plan() {
    let mut view = skewed_view(4, 4);
    view.shards.get_mut(&2).unwrap().leader = Some(4);
    assert_eq!(plan_balance(&view), vec![]);
    assert!(matches!(
        plan_drain(&view, 1),
        Err(PlacementError::InvalidView { .. })
    ));
    let mut view = skewed_view(4, 4);
    view.shards.get_mut(&2).unwrap().replicas.insert(9);
    assert!(matches!(
        view.validate(),
        Err(PlacementError::InvalidView { .. })
    ));
}

#[test]
fn a_view_from_the_map_drops_leaders_that_are_not_replicas() {
    let map = PlacementMap::bootstrap(&nodes(5), 4, 3).unwrap();
    let leaders = BTreeMap::from([
        (1, *map.shard(1).unwrap().replicas.first().unwrap()),
        (2, 99),
    ]);
    let view = ClusterView::from_map(&map, &leaders);
    assert_eq!(view.shards[&1].leader, leaders.get(&1).copied());
    assert_eq!(view.shards[&2].leader, None);
    assert_eq!(view.replication_factor, 3);
    assert_eq!(view.validate(), Ok(()));
}

// ---------------------------------------------------------- random views

fn random_view() -> impl Strategy<Value = ClusterView> {
    let state = prop_oneof![
        6 => Just(NodeState::Up),
        1 => Just(NodeState::Draining),
        1 => Just(NodeState::Drained),
        1 => Just(NodeState::Down),
    ];
    (
        proptest::collection::vec((state, proptest::bool::weighted(0.1)), 1..=8),
        1usize..=5,
        proptest::collection::vec((any::<u64>(), any::<u8>()), 1..=40),
    )
        .prop_map(|(node_specs, rf, shard_specs)| {
            let ids: Vec<u64> = (1..=node_specs.len() as u64).collect();
            let nodes = ids
                .iter()
                .zip(&node_specs)
                .map(|(&id, (s, _))| (id, *s))
                .collect();
            let down = ids
                .iter()
                .zip(&node_specs)
                .filter(|(_, (_, d))| *d)
                .map(|(&id, _)| id)
                .collect();
            let shards = shard_specs
                .iter()
                .enumerate()
                .map(|(i, &(bits, lead))| {
                    // `bits` chooses which nodes hold the shard (at most rf).
                    let mut replicas: BTreeSet<u64> = ids
                        .iter()
                        .copied()
                        .filter(|id| bits >> (id % 64) & 1 == 1)
                        .take(rf)
                        .collect();
                    if replicas.is_empty() {
                        replicas.insert(ids[bits as usize % ids.len()]);
                    }
                    let leader = (lead % 4 != 0)
                        .then(|| *replicas.iter().nth(lead as usize % replicas.len()).unwrap());
                    (i as u64, ShardView { replicas, leader })
                })
                .collect();
            ClusterView {
                nodes,
                down,
                shards,
                replication_factor: rf,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_views_get_safe_deterministic_idempotent_plans(view in random_view(), drained in 1u64..=8) {
        prop_assert_eq!(view.validate(), Ok(()));
        let plan = plan_balance(&view);
        prop_assert_eq!(&plan_balance(&view), &plan);
        let end = execute(&view, &plan);
        prop_assert!(spread(&end.replica_counts()) <= 1, "{:?}", end.replica_counts());
        prop_assert_eq!(plan_balance(&end), vec![]);

        match plan_drain(&view, drained) {
            Ok(plan) => {
                prop_assert_eq!(&plan_drain(&view, drained), &Ok(plan.clone()));
                let end = execute(&view, &plan);
                prop_assert!(end.shards.values().all(|s| !s.replicas.contains(&drained) && s.leader != Some(drained)));
            }
            Err(PlacementError::UnknownNode { node_id }) => {
                prop_assert!(!view.nodes.contains_key(&node_id));
            }
            Err(PlacementError::CannotDrain { shard_id, .. }) => {
                // Really no accepting node outside that shard's replicas.
                let replicas = &view.shards[&shard_id].replicas;
                prop_assert!(replicas.contains(&drained));
                prop_assert!(view.nodes.keys().all(|&n| n == drained || replicas.contains(&n) || !view.accepts(n)));
            }
            Err(other) => prop_assert!(false, "unexpected {other}"),
        }
    }
}

/// Five nodes, sixteen data shards (and the meta shard) on nodes 1..=3,
/// node `dead` observed down.
fn view_with_dead_node(dead: u64) -> ClusterView {
    let mut view = skewed_view(5, 16);
    view.down.insert(dead);
    view
}

#[test]
fn a_dead_nodes_replicas_are_replaced_on_live_nodes_least_loaded_first() {
    let view = view_with_dead_node(2);
    let plan = plan_repair(&view, 100);
    assert_eq!(plan.len(), 17, "every shard had a replica on node 2");
    for action in &plan {
        let Action::MoveReplica { from, to, .. } = *action else {
            panic!("repair only moves replicas: {action:?}");
        };
        assert_eq!(from, 2);
        assert!(
            to == 4 || to == 5,
            "to an empty live node first: {action:?}"
        );
    }
    let end = execute(&view, &plan);
    assert!(end.shards.values().all(|s| !s.replicas.contains(&2)));
    let counts = end.replica_counts();
    assert!(counts[&4].abs_diff(counts[&5]) <= 1, "{counts:?}");
    assert_eq!(plan_repair(&end, 100), vec![], "a fixed point");
}

#[test]
fn repair_takes_at_most_the_moves_it_is_allowed_and_continues_next_time() {
    let view = view_with_dead_node(3);
    let first = plan_repair(&view, 4);
    assert_eq!(first.len(), 4);
    let after = execute(&view, &first);
    let second = plan_repair(&after, 100);
    assert_eq!(second.len(), 13);
    assert!(second.iter().all(|a| !first.contains(a)));
    assert_eq!(plan_repair(&view, 0), vec![]);
}

#[test]
fn a_shard_without_a_reachable_majority_is_never_touched() {
    let mut view = skewed_view(5, 4);
    view.down.extend([2, 3]);
    assert_eq!(
        plan_repair(&view, 100),
        vec![],
        "two of three down: no shard has a majority"
    );
    // Shard 1 on {1, 4, 5}; nodes 2 and 5 down: every shard keeps two of
    // three, so every one is repaired, shard 1 onto the one node it lacks.
    view.shards.get_mut(&1).unwrap().replicas = [1, 4, 5].into();
    view.down = [2, 5].into();
    let plan = plan_repair(&view, 100);
    assert!(plan.contains(&Action::MoveReplica {
        shard_id: 1,
        from: 5,
        to: 3
    }));
    assert_eq!(plan.len(), 5, "{plan:?}");
    let end = execute(&view, &plan);
    assert!(end
        .shards
        .values()
        .all(|s| s.replicas.iter().all(|n| !end.down.contains(n))));
}

#[test]
fn nothing_down_means_nothing_to_repair() {
    assert_eq!(plan_repair(&skewed_view(5, 16), 100), vec![]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Given any view, a repair plan stays within its bound, only moves
    /// replicas off down nodes onto accepting ones, never touches a shard
    /// without a reachable majority, never lowers any shard's live voters
    /// (`execute` checks every step), and replanning converges: a fixed
    /// point where every shard with a reachable majority either has no
    /// replica on a down node or has no accepting node left to go to.
    #[test]
    fn repair_plans_are_bounded_safe_and_converge(view in random_view(), max_moves in 0usize..=6) {
        let reachable_majority = |v: &ClusterView, id: u64| {
            let r = &v.shards[&id].replicas;
            r.iter().filter(|n| !v.down.contains(n)).count() * 2 > r.len()
        };
        let mut at = view.clone();
        for round in 0..=MAX_SHARDS {
            let plan = plan_repair(&at, max_moves);
            prop_assert_eq!(&plan_repair(&at, max_moves), &plan, "deterministic");
            prop_assert!(plan.len() <= max_moves);
            for action in &plan {
                let Action::MoveReplica { shard_id, from, to } = *action else {
                    return Err(TestCaseError::fail(format!("not a move: {action:?}")));
                };
                prop_assert!(at.down.contains(&from), "{action:?} moves a reachable replica");
                prop_assert!(at.accepts(to), "{action:?} moves to a node that does not accept");
                prop_assert!(reachable_majority(&at, shard_id), "{action:?} touches a shard without a majority");
            }
            if plan.is_empty() {
                break;
            }
            prop_assert!(round < MAX_SHARDS, "no fixed point");
            at = execute(&at, &plan);
        }
        if max_moves > 0 {
            for (&id, shard) in &at.shards {
                if !reachable_majority(&at, id) {
                    prop_assert_eq!(&shard.replicas, &view.shards[&id].replicas, "shard {} changed", id);
                    continue;
                }
                let stuck = shard.replicas.iter().any(|n| at.down.contains(n));
                let somewhere = at.nodes.keys().any(|&n| at.accepts(n) && !shard.replicas.contains(&n));
                prop_assert!(!(stuck && somewhere), "shard {} left on a down node with room elsewhere", id);
            }
        }
    }
}

fn spread_of(counts: BTreeMap<u64, usize>) -> usize {
    spread(&counts)
}

#[test]
fn rebalance_moves_replicas_to_an_empty_node_and_then_settles() {
    // Every shard on nodes 1..=3 of five: nodes 4 and 5 are empty.
    let view = skewed_view(5, 16);
    let mut at = view.clone();
    let mut rounds = 0;
    loop {
        let plan = plan_rebalance(&at, 2, REBALANCE_REPLICA_SPREAD, 3);
        assert!(plan.len() <= 2);
        if plan.is_empty() {
            break;
        }
        at = execute(&at, &plan);
        rounds += 1;
        assert!(rounds < 200, "no fixed point");
    }
    assert!(
        spread_of(at.replica_counts()) <= 1,
        "{:?}",
        at.replica_counts()
    );
    assert!(
        spread_of(at.leader_counts()) < 3,
        "{:?}",
        at.leader_counts()
    );
    // One leadership moved by an election does not restart anything.
    let mut nudged = at.clone();
    if let Some(shard) = nudged.shards.values_mut().find(|s| s.leader.is_some()) {
        shard.leader = shard.replicas.iter().next().copied();
    }
    if spread_of(nudged.leader_counts()) < 3 {
        assert_eq!(
            plan_rebalance(&nudged, 2, REBALANCE_REPLICA_SPREAD, 3),
            vec![]
        );
    }
}

#[test]
fn a_balanced_cluster_gets_no_rebalance() {
    let view = skewed_view(3, 8);
    assert_eq!(spread_of(view.replica_counts()), 0);
    let mut led = view.clone();
    // Spread leaders one per node where possible: under the threshold.
    for (i, shard) in led.shards.values_mut().enumerate() {
        shard.leader = Some(1 + (i as u64 % 3));
    }
    assert_eq!(plan_rebalance(&led, 4, REBALANCE_REPLICA_SPREAD, 3), vec![]);
    // All leaders on node 1: past the threshold, leaderships move.
    let plan = plan_rebalance(&view, 4, REBALANCE_REPLICA_SPREAD, 3);
    assert!(!plan.is_empty());
    assert!(plan
        .iter()
        .all(|a| matches!(a, Action::TransferLeader { .. })));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Rebalancing in rounds of at most `max_moves` keeps every shard's live
    /// replicas (`execute` checks each step), and reaches a fixed point
    /// where replica counts are within the hysteresis threshold.
    #[test]
    fn rebalance_rounds_are_bounded_safe_and_settle(view in random_view(), max_moves in 1usize..=4, replica_spread in 2usize..=4, leader_spread in 2usize..=5) {
        let mut at = view;
        let mut settled = false;
        for _ in 0..(4 * MAX_ACTIONS_PER_PLAN) {
            let plan = plan_rebalance(&at, max_moves, replica_spread, leader_spread);
            prop_assert!(plan.len() <= max_moves);
            if plan.is_empty() {
                settled = true;
                break;
            }
            at = execute(&at, &plan);
        }
        prop_assert!(settled, "no fixed point");
        prop_assert!(spread_of(at.replica_counts()) < replica_spread, "{:?}", at.replica_counts());
    }
}

fn load(held_locks: u64, owned_slots: u32) -> ShardLoad {
    ShardLoad {
        held_locks,
        owned_slots,
        writes_per_sec: 0,
    }
}

fn writing(writes_per_sec: u64) -> ShardLoad {
    ShardLoad {
        writes_per_sec,
        owned_slots: 64,
        ..ShardLoad::default()
    }
}

/// Leaders' weights per accepting node under `loads`.
fn leader_weights(view: &ClusterView, loads: &BTreeMap<u64, ShardLoad>) -> BTreeMap<u64, u64> {
    let mut out: BTreeMap<u64, u64> = view.leader_counts().keys().map(|&n| (n, 0)).collect();
    for (id, shard) in &view.shards {
        if let Some(w) = shard.leader.and_then(|l| out.get_mut(&l)) {
            *w += loads.get(id).map_or(0, ShardLoad::weight);
        }
    }
    out
}

fn rule(leader_spread: usize) -> LoadRule {
    LoadRule {
        leader_spread,
        min_weight: DEFAULT_LOAD_MIN_WEIGHT,
        gain_percent: DEFAULT_LOAD_GAIN_PERCENT,
    }
}

/// Three nodes, six shards on all three, two led by each: even counts.
fn even_counts_view() -> ClusterView {
    ClusterView {
        nodes: (1..=3).map(|n| (n, NodeState::Up)).collect(),
        down: BTreeSet::new(),
        shards: (1..=6u64)
            .map(|id| {
                let shard = ShardView {
                    replicas: [1, 2, 3].into(),
                    leader: Some((id - 1) / 2 + 1),
                };
                (id, shard)
            })
            .collect(),
        replication_factor: 3,
    }
}

#[test]
fn a_shard_writing_over_the_rate_threshold_is_split_the_furthest_over_first() {
    let mut loads: BTreeMap<u64, ShardLoad> = (1..=4).map(|id| (id, writing(100))).collect();
    loads.insert(2, writing(900));
    loads.insert(
        3,
        ShardLoad {
            held_locks: 1_500,
            ..writing(100)
        },
    );
    assert_eq!(plan_split(&loads, 0, 1_000, 5), None, "none over the rate");
    assert_eq!(plan_split(&loads, 0, 800, 5), Some(2), "by rate");
    // 1,500 locks over 1,000 is further over than 900 writes over 800.
    assert_eq!(
        plan_split(&loads, 1_000, 800, 5),
        Some(3),
        "the furthest over"
    );
    assert_eq!(plan_split(&loads, 0, 0, 5), None, "both off");
}

#[test]
fn a_node_leading_two_hot_shards_hands_one_off_and_then_it_settles() {
    let view = even_counts_view();
    // Node 1 leads shards 1 and 2, both hot; the rest is quiet.
    let mut loads: BTreeMap<u64, ShardLoad> = (1..=6).map(|id| (id, writing(10))).collect();
    loads.insert(1, writing(400));
    loads.insert(2, writing(400));
    let plan = plan_load_leaders(&view, &loads, 2, &rule(3));
    assert_eq!(plan.len(), 1, "{plan:?}");
    let Action::TransferLeader { shard_id, to } = plan[0] else {
        panic!("a leader transfer: {plan:?}");
    };
    assert!(shard_id == 1 || shard_id == 2);
    assert_ne!(to, 1);
    let at = execute(&view, &plan);
    let weights = leader_weights(&at, &loads);
    assert!(
        weights[&1] <= 410 && weights.values().max() < Some(&800),
        "{weights:?}"
    );
    assert_eq!(
        plan_load_leaders(&at, &loads, 2, &rule(3)),
        vec![],
        "settled"
    );
    // Leadership counts stay within the spread that would restart a
    // count rebalance.
    assert!(spread(&at.leader_counts()) < 3, "{:?}", at.leader_counts());
}

#[test]
fn small_or_even_loads_move_nothing() {
    let view = even_counts_view();
    let quiet: BTreeMap<u64, ShardLoad> = (1..=6).map(|id| (id, writing(20))).collect();
    assert_eq!(
        plan_load_leaders(&view, &quiet, 2, &rule(3)),
        vec![],
        "under the minimum"
    );
    let even: BTreeMap<u64, ShardLoad> = (1..=6).map(|id| (id, writing(500))).collect();
    assert_eq!(
        plan_load_leaders(&view, &even, 2, &rule(3)),
        vec![],
        "already even"
    );
    // Held locks weigh too, a hundred to a write a second.
    let held: BTreeMap<u64, ShardLoad> = [(1, load(40_000, 64)), (2, load(40_000, 64))].into();
    assert_eq!(plan_load_leaders(&view, &held, 2, &rule(3)).len(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// With any view and fixed loads, load moves are leader transfers the
    /// planner's own checks accept (`execute`), at most `max_moves` a round,
    /// never widen leadership counts to `leader_spread`, and rounds reach
    /// a fixed point.
    #[test]
    fn load_moves_are_bounded_safe_and_settle(
        view in random_view(),
        rates in proptest::collection::vec(0u64..2_000, 12),
        max_moves in 1usize..=4,
        leader_spread in 2usize..=5,
    ) {
        let loads: BTreeMap<u64, ShardLoad> = view
            .shards
            .keys()
            .zip(rates.iter())
            .map(|(&id, &r)| (id, writing(r)))
            .collect();
        let mut at = view;
        let mut settled = false;
        for _ in 0..(8 * MAX_ACTIONS_PER_PLAN) {
            let plan = plan_load_leaders(&at, &loads, max_moves, &rule(leader_spread));
            prop_assert!(plan.len() <= max_moves);
            if plan.is_empty() {
                settled = true;
                break;
            }
            for action in &plan {
                prop_assert!(matches!(action, Action::TransferLeader { .. }), "{:?}", action);
            }
            let before = spread(&at.leader_counts());
            at = execute(&at, &plan);
            let after = spread(&at.leader_counts());
            prop_assert!(after < leader_spread.max(2) || after <= before, "{} -> {}", before, after);
        }
        prop_assert!(settled, "no fixed point");
    }
}

#[test]
fn the_busiest_shard_over_the_threshold_is_split_and_nothing_else() {
    let loads: BTreeMap<u64, ShardLoad> = [
        (0, load(10_000, 0)),
        (1, load(150, 256)),
        (2, load(900, 256)),
        (3, load(900, 1)),
        (4, load(99, 512)),
    ]
    .into();
    assert_eq!(
        plan_split(&loads, 100, 0, 5),
        Some(2),
        "most locks, splittable"
    );
    assert_eq!(
        plan_split(&loads, 1_000, 0, 5),
        None,
        "none over the threshold"
    );
    assert_eq!(plan_split(&loads, 0, 0, 5), None, "0 is off");
    assert_eq!(
        plan_split(&loads, 100, 0, MAX_SHARDS),
        None,
        "the shard table is full"
    );
    let single_slot: BTreeMap<u64, ShardLoad> = [(3, load(900, 1))].into();
    assert_eq!(
        plan_split(&single_slot, 100, 0, 5),
        None,
        "one slot cannot split"
    );
}
