//! How many workers a run may have out of service at once, and how many may fail their
//! cycle and be left behind: the node cycle plans batches by the first, the engine decides
//! a worker's failure by the second.

/// `text` as a whole number of workers, and whether it is a percentage (`25%`); only
/// digits, no sign.
fn count_or_percent(text: &str) -> Option<(u32, bool)> {
    let text = text.trim();
    let (number, percent) = match text.strip_suffix('%') {
        Some(number) => (number.trim(), true),
        None => (text, false),
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((number.parse().ok()?, percent))
}

/// How many workers may be out of service at once (`cluster.max_unavailable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxUnavailable {
    /// This many.
    Count(u32),
    /// This percentage of the cluster's workers, rounded down.
    Percent(u32),
}

impl Default for MaxUnavailable {
    fn default() -> Self {
        Self::Count(1)
    }
}

impl MaxUnavailable {
    /// `2` or `25%`; at least 1, a percentage at most 100.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{:?} is not a count of workers (1, 2, …) or a percentage of them (1% to 100%)",
                text.trim()
            )
        };
        match count_or_percent(text).ok_or_else(bad)? {
            (0, _) | (101.., true) => Err(bad()),
            (n, true) => Ok(Self::Percent(n)),
            (n, false) => Ok(Self::Count(n)),
        }
    }

    /// The batch size for a cluster of `workers` workers: at least 1.
    pub fn of(self, workers: usize) -> usize {
        let n = match self {
            Self::Count(n) => n as usize,
            Self::Percent(p) => workers * p as usize / 100,
        };
        n.clamp(1, workers.max(1))
    }
}

impl std::fmt::Display for MaxUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// How many of the cluster's nodes may be NotReady, for reasons not of rollgate's own work,
/// before no new node is taken (`cluster.unhealthy_limit`, the circuit breaker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnhealthyLimit {
    /// This many nodes.
    Count(u32),
    /// This percentage of the cluster's nodes.
    Percent(u32),
}

impl Default for UnhealthyLimit {
    /// 20 %, as Karpenter's node repair uses.
    fn default() -> Self {
        Self::Percent(20)
    }
}

impl UnhealthyLimit {
    /// `3` or `20%`; a percentage at most 100 (`100%` never trips).
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{:?} is not a count of nodes (0, 1, 2, …) or a percentage of them (0% to 100%)",
                text.trim()
            )
        };
        match count_or_percent(text).ok_or_else(bad)? {
            (101.., true) => Err(bad()),
            (n, true) => Ok(Self::Percent(n)),
            (n, false) => Ok(Self::Count(n)),
        }
    }

    /// Whether `unhealthy` of `nodes` nodes is more than the limit allows.
    pub fn exceeded(self, unhealthy: usize, nodes: usize) -> bool {
        match self {
            Self::Count(n) => unhealthy > n as usize,
            Self::Percent(p) => unhealthy * 100 > nodes * p as usize,
        }
    }
}

impl std::fmt::Display for UnhealthyLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// How many workers may fail their cycle (drain, node script or verify, after their
/// attempts) and be left behind, cordoned, while the run goes on with the others
/// (`cluster.failure_budget`). Control planes have no budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureBudget {
    /// This many.
    Count(u32),
    /// This percentage of the run's workers, rounded down.
    Percent(u32),
    /// None may fail: the first failure halts the run.
    #[default]
    None,
}

impl FailureBudget {
    /// `0`, `2` or `10%`; a percentage at most 100.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{:?} is not a count of workers (0, 1, 2, …) or a percentage of them (0% to 100%)",
                text.trim()
            )
        };
        match count_or_percent(text).ok_or_else(bad)? {
            (0, _) => Ok(Self::None),
            (101.., true) => Err(bad()),
            (n, true) => Ok(Self::Percent(n)),
            (n, false) => Ok(Self::Count(n)),
        }
    }

    /// How many of `workers` may be left behind.
    pub fn of(self, workers: usize) -> usize {
        match self {
            Self::None => 0,
            Self::Count(n) => n as usize,
            Self::Percent(p) => workers * p as usize / 100,
        }
    }

    /// Why this budget cannot apply to a cluster of `workers` workers, if it cannot.
    pub fn check(self, workers: usize) -> Result<(), String> {
        match self {
            Self::Count(n) if n as usize > workers => Err(format!(
                "cluster.failure_budget {n} is larger than the cluster's {workers} worker(s)"
            )),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for FailureBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => write!(f, "0"),
            Self::Count(n) => write!(f, "{n}"),
            Self::Percent(p) => write!(f, "{p}%"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_unavailable_is_a_count_or_a_share_of_the_workers() {
        use MaxUnavailable::{Count, Percent};
        let parsed = [
            ("1", Ok(Count(1))),
            ("4", Ok(Count(4))),
            ("25%", Ok(Percent(25))),
            (" 100% ", Ok(Percent(100))),
            ("0", Err(())),
            ("0%", Err(())),
            ("101%", Err(())),
            ("-1", Err(())),
            ("two", Err(())),
            ("", Err(())),
        ];
        for (text, want) in parsed {
            assert_eq!(MaxUnavailable::parse(text).map_err(drop), want, "{text:?}");
        }
        // (setting, workers in the cluster, batch size)
        let sizes = [
            (Count(1), 12, 1),
            (Count(4), 12, 4),
            (Count(20), 12, 12),
            (Count(2), 0, 1),
            (Percent(25), 12, 3),
            (Percent(25), 3, 1),
            (Percent(50), 5, 2),
            (Percent(100), 6, 6),
        ];
        for (setting, workers, want) in sizes {
            assert_eq!(setting.of(workers), want, "{setting} of {workers}");
        }
    }

    #[test]
    fn the_unhealthy_limit_trips_only_beyond_its_count_or_share() {
        // (limit, unhealthy, nodes, exceeded)
        let cases = [
            ("20%", 2, 13, false),
            ("20%", 3, 13, true),
            ("20%", 2, 10, false),
            ("20%", 3, 10, true),
            ("0%", 1, 1000, true),
            ("0", 0, 13, false),
            ("0", 1, 13, true),
            ("3", 3, 13, false),
            ("3", 4, 13, true),
            ("100%", 13, 13, false),
        ];
        for (limit, unhealthy, nodes, exceeded) in cases {
            let parsed = UnhealthyLimit::parse(limit).unwrap();
            assert_eq!(parsed.to_string(), limit);
            assert_eq!(
                parsed.exceeded(unhealthy, nodes),
                exceeded,
                "{limit}: {unhealthy} of {nodes}"
            );
        }
        for bad in ["", "-1", "101%", "a lot", "2.5"] {
            assert!(UnhealthyLimit::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(UnhealthyLimit::default(), UnhealthyLimit::Percent(20));
    }

    #[test]
    fn a_failure_budget_is_a_count_or_a_share_of_the_workers() {
        use FailureBudget::*;
        let parsed = [
            ("0", Some(None)),
            ("0%", Some(None)),
            ("2", Some(Count(2))),
            ("10%", Some(Percent(10))),
            (" 100% ", Some(Percent(100))),
            ("101%", Option::None),
            ("-1", Option::None),
            ("+1", Option::None),
            ("1.5", Option::None),
            ("a", Option::None),
            ("", Option::None),
        ];
        for (text, want) in parsed {
            assert_eq!(FailureBudget::parse(text).ok(), want, "{text:?}");
        }
        for (budget, workers, want) in [
            (None, 12, 0),
            (Count(2), 12, 2),
            (Percent(10), 12, 1),
            (Percent(10), 9, 0),
            (Percent(100), 5, 5),
        ] {
            assert_eq!(budget.of(workers), want, "{budget} of {workers}");
        }
    }
}
