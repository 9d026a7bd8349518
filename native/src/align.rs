//! A group-free step alignment: the DP rows (evaluator/scorers/alignment.py `bare_rows`, the
//! Levenshtein recurrence over observed-step ids) and their traceback (alignment.py `_traceback`,
//! the same choices in the same order), which step_accuracy.py `bare_entries` is the reference of.

/// `rows[i][j]`: the cheapest alignment of the first `i` expected tokens with the first `j`
/// observed steps; token `i` matches an observed id equal to either of `same[i]`.
pub fn bare_rows(same: &[(i64, i64)], obs: &[i64]) -> Vec<Vec<i64>> {
    let mut rows: Vec<Vec<i64>> = Vec::with_capacity(same.len() + 1);
    rows.push((0..=obs.len() as i64).collect());
    for &(tool_id, agent_id) in same {
        let prev = &rows[rows.len() - 1];
        let mut row = Vec::with_capacity(obs.len() + 1);
        let mut left = prev[0] + 1;
        row.push(left);
        for (j, &sid) in obs.iter().enumerate() {
            let diagonal = prev[j];
            let above = prev[j + 1];
            let mut best = if sid == tool_id || sid == agent_id {
                diagonal
            } else {
                diagonal + 1
            };
            best = best.min(above + 1).min(left + 1);
            left = best;
            row.push(best);
        }
        rows.push(row);
    }
    rows
}

/// One entry of the alignment: the op and the expected token / observed step it involves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aligned {
    Match(usize, usize),
    Substitute(usize, usize),
    Delete(usize),
    Insert(usize),
}

/// The edit distance and the entries in sequence order. Ties are broken as alignment.py
/// `_traceback` breaks them, walking back from the last cell: a match or substitution first, then
/// a deletion, then an insertion.
pub fn bare_alignment(same: &[(i64, i64)], obs: &[i64]) -> (i64, Vec<Aligned>) {
    let rows = bare_rows(same, obs);
    let (mut i, mut j) = (same.len(), obs.len());
    let mut out = Vec::with_capacity(i.max(j));
    while i > 0 {
        let here = rows[i][j];
        if j > 0 {
            let (tool_id, agent_id) = same[i - 1];
            let matched = obs[j - 1] == tool_id || obs[j - 1] == agent_id;
            if here == rows[i - 1][j - 1] + i64::from(!matched) {
                out.push(if matched {
                    Aligned::Match(i - 1, j - 1)
                } else {
                    Aligned::Substitute(i - 1, j - 1)
                });
                i -= 1;
                j -= 1;
                continue;
            }
        }
        if here == rows[i - 1][j] + 1 {
            out.push(Aligned::Delete(i - 1));
            i -= 1;
        } else {
            out.push(Aligned::Insert(j - 1));
            j -= 1;
        }
    }
    while j > 0 {
        out.push(Aligned::Insert(j - 1));
        j -= 1;
    }
    out.reverse();
    (rows[same.len()][obs.len()], out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceback_prefers_the_diagonal_then_deletion() {
        // expected [a, b] (ids 0, 1), observed [b, a, b]: insert b, match a, match b
        let (distance, steps) = bare_alignment(&[(0, -1), (-1, 1)], &[1, 0, 1]);
        assert_eq!(distance, 1);
        assert_eq!(
            steps,
            vec![Aligned::Insert(0), Aligned::Match(0, 1), Aligned::Match(1, 2)]
        );
        // nothing observed: every token deleted; nothing expected: every step inserted
        assert_eq!(bare_alignment(&[(0, -1)], &[]), (1, vec![Aligned::Delete(0)]));
        assert_eq!(bare_alignment(&[], &[3]), (1, vec![Aligned::Insert(0)]));
    }

    #[test]
    fn levenshtein_rows() {
        // expected [a, b] (ids 0, 1), observed [b, a, b]
        let rows = bare_rows(&[(0, -1), (-1, 1)], &[1, 0, 1]);
        assert_eq!(rows, vec![vec![0, 1, 2, 3], vec![1, 1, 1, 2], vec![2, 1, 2, 1]]);
        assert_eq!(bare_rows(&[], &[]), vec![vec![0]]);
    }
}
