//! The world's parameters and the rules that depend only on them: what is on the map, who
//! sees whom, and where a step lands.

use std::fmt;

use crate::types::{Direction, Position};

/// The most sectors a world may have. Each sector costs an empty `Vec` even when nobody is in
/// it, so a huge map with a tiny view range is refused rather than allocating gigabytes.
pub const MAX_SECTORS: u64 = 1 << 22;

/// The world's parameters (DESIGN.md section 1). Validate with [`WorldConfig::validate`].
/// Not `Copy`, so that adding a setting that owns memory later breaks no caller.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct WorldConfig {
    /// Map width in cells; `0 <= x < width`.
    pub width: u32,
    /// Map height in cells; `0 <= y < height`.
    pub height: u32,
    /// Sight range `R`: A sees B iff both coordinates differ by at most `R` (a square).
    pub view_range: u32,
    /// Moves per second per player, which is also the burst a player may spend at once.
    pub move_rate: u32,
}

impl Default for WorldConfig {
    fn default() -> WorldConfig {
        WorldConfig { width: 400, height: 400, view_range: 20, move_rate: 20 }
    }
}

/// One thing wrong with a [`WorldConfig`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ConfigProblem {
    ZeroWidth,
    ZeroHeight,
    /// A zero rate would refuse every move, which is never what an operator meant.
    ZeroMoveRate,
    /// The map divided into sectors of side `view_range` has too many sectors.
    TooManySectors {
        sectors: u64,
    },
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigProblem::ZeroWidth => write!(f, "width must be at least 1"),
            ConfigProblem::ZeroHeight => write!(f, "height must be at least 1"),
            ConfigProblem::ZeroMoveRate => write!(f, "move_rate must be at least 1"),
            ConfigProblem::TooManySectors { sectors } => write!(
                f,
                "the map needs {sectors} sectors of side view_range, more than {MAX_SECTORS}; \
                 raise view_range or shrink the map"
            ),
        }
    }
}

/// Every problem found in a [`WorldConfig`], so an operator can fix them all in one go.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("invalid world config: {}", join_problems(.problems))]
pub struct ConfigError {
    pub problems: Vec<ConfigProblem>,
}

fn join_problems(problems: &[ConfigProblem]) -> String {
    let texts: Vec<String> = problems.iter().map(ToString::to_string).collect();
    texts.join("; ")
}

impl WorldConfig {
    /// Checks the config as a whole and lists every problem.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        if self.width == 0 {
            problems.push(ConfigProblem::ZeroWidth);
        }
        if self.height == 0 {
            problems.push(ConfigProblem::ZeroHeight);
        }
        if self.move_rate == 0 {
            problems.push(ConfigProblem::ZeroMoveRate);
        }
        let (columns, rows) = self.sector_grid_size();
        let sectors = columns * rows;
        if sectors > MAX_SECTORS {
            problems.push(ConfigProblem::TooManySectors { sectors });
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems })
        }
    }

    /// The side of a square sector. It equals the view range so that everyone in sight of a
    /// cell is in the 3x3 sectors around the cell's sector; a range of 0 still needs side 1.
    pub fn sector_side(&self) -> u32 {
        self.view_range.max(1)
    }

    /// Sector columns and rows, in `u64` so that validation cannot overflow.
    fn sector_grid_size(&self) -> (u64, u64) {
        let side = u64::from(self.sector_side());
        (u64::from(self.width).div_ceil(side), u64::from(self.height).div_ceil(side))
    }

    /// Whether `position` is a cell of the map.
    pub fn contains(&self, position: Position) -> bool {
        position.x < self.width && position.y < self.height
    }

    /// Whether an entity at `a` sees one at `b` (the caller excludes an entity seeing itself).
    #[inline]
    pub fn in_sight(&self, a: Position, b: Position) -> bool {
        a.x.abs_diff(b.x) <= self.view_range && a.y.abs_diff(b.y) <= self.view_range
    }

    /// Where one step from `from` lands; a step off the map leaves the position unchanged.
    pub fn step(&self, from: Position, direction: Direction) -> Position {
        let Position { x, y } = from;
        match direction {
            Direction::Up => Position::new(x, y.saturating_sub(1)),
            Direction::Down if y.saturating_add(1) < self.height => Position::new(x, y + 1),
            Direction::Left => Position::new(x.saturating_sub(1), y),
            Direction::Right if x.saturating_add(1) < self.width => Position::new(x + 1, y),
            Direction::Down | Direction::Right => from,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_the_design_world() {
        let config = WorldConfig::default();
        assert_eq!(
            (config.width, config.height, config.view_range, config.move_rate),
            (400, 400, 20, 20)
        );
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn validate_lists_every_problem() {
        let config = WorldConfig { width: 0, height: 0, view_range: 5, move_rate: 0 };
        let error = config.validate().expect_err("an all-zero config is invalid");
        assert_eq!(
            error.problems,
            vec![ConfigProblem::ZeroWidth, ConfigProblem::ZeroHeight, ConfigProblem::ZeroMoveRate]
        );
        let text = error.to_string();
        assert!(text.contains("width") && text.contains("height") && text.contains("move_rate"));
    }

    #[test]
    fn validate_refuses_too_many_sectors() {
        let config = WorldConfig { width: u32::MAX, height: u32::MAX, view_range: 0, move_rate: 1 };
        let error = config.validate().expect_err("4e9 x 4e9 sectors is too many");
        assert!(matches!(error.problems[..], [ConfigProblem::TooManySectors { .. }]));
        let huge_range = WorldConfig { view_range: u32::MAX, ..config };
        assert_eq!(huge_range.validate(), Ok(()));
    }

    #[test]
    fn sight_is_a_square_including_its_border() {
        let config = WorldConfig::default();
        let centre = Position::new(100, 100);
        assert!(config.in_sight(centre, Position::new(120, 120)));
        assert!(config.in_sight(centre, Position::new(80, 80)));
        assert!(!config.in_sight(centre, Position::new(121, 100)));
        assert!(!config.in_sight(centre, Position::new(100, 79)));
        let blind = WorldConfig { view_range: 0, ..config };
        assert!(blind.in_sight(centre, centre));
        assert!(!blind.in_sight(centre, Position::new(101, 100)));
    }

    #[test]
    fn steps_clamp_at_every_edge() {
        let config = WorldConfig { width: 3, height: 2, ..WorldConfig::default() };
        let top_left = Position::new(0, 0);
        let bottom_right = Position::new(2, 1);
        assert_eq!(config.step(top_left, Direction::Up), top_left);
        assert_eq!(config.step(top_left, Direction::Left), top_left);
        assert_eq!(config.step(bottom_right, Direction::Down), bottom_right);
        assert_eq!(config.step(bottom_right, Direction::Right), bottom_right);
        assert_eq!(config.step(top_left, Direction::Down), Position::new(0, 1));
        assert_eq!(config.step(top_left, Direction::Right), Position::new(1, 0));
        assert_eq!(config.step(bottom_right, Direction::Up), Position::new(2, 0));
        assert_eq!(config.step(bottom_right, Direction::Left), Position::new(1, 1));
    }
}
