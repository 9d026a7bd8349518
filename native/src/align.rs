//! The DP rows of a group-free step alignment (evaluator/scorers/alignment.py `bare_rows`, the
//! reference this must equal row for row): the Levenshtein recurrence over observed-step ids.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levenshtein_rows() {
        // expected [a, b] (ids 0, 1), observed [b, a, b]
        let rows = bare_rows(&[(0, -1), (-1, 1)], &[1, 0, 1]);
        assert_eq!(rows, vec![vec![0, 1, 2, 3], vec![1, 1, 1, 2], vec![2, 1, 2, 1]]);
        assert_eq!(bare_rows(&[], &[]), vec![vec![0]]);
    }
}
