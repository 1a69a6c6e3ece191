//! An extension round's verdict ([`verdict`]): extended on a quorum, not held where as
//! many nodes said so as failed, short of nodes otherwise (a deadline that cut every
//! answer included: that is no proof the lock is gone).

use super::verdict;
use crate::error::{LockError, NodeError};
use crate::quorum::Outcome;
use crate::votes::Votes;

/// What a node answered a compare-and-pexpire.
#[derive(Clone, Copy)]
enum Answer {
    Extended,
    NotOurs,
    TimedOut,
}

/// The votes and the not-held count of a 3-node round that got `answers`.
fn round(answers: &[Answer]) -> (Votes, usize) {
    let mut votes = Votes::new(3);
    let mut not_held = 0;
    for (i, answer) in answers.iter().enumerate() {
        let outcome = match answer {
            Answer::Extended => Ok(Outcome::Granted),
            Answer::NotOurs => {
                not_held += 1;
                Ok(Outcome::Failed)
            }
            Answer::TimedOut => Err(NodeError::Timeout),
        };
        votes.count(&format!("node-{i}"), outcome);
    }
    (votes, not_held)
}

fn verdict_of(answers: &[Answer]) -> Result<(), LockError> {
    let (votes, not_held) = round(answers);
    verdict(votes, not_held)
}

#[test]
fn a_quorum_of_extensions_extends() {
    use Answer::*;
    assert!(verdict_of(&[Extended, Extended]).is_ok());
    assert!(verdict_of(&[Extended, TimedOut, Extended]).is_ok());
}

#[test]
fn nodes_that_say_not_ours_as_often_as_others_fail_mean_not_held() {
    use Answer::*;
    for answers in [
        &[NotOurs, NotOurs][..],
        &[Extended, NotOurs, NotOurs],
        &[TimedOut, NotOurs],
    ] {
        match verdict_of(answers) {
            Err(LockError::NotHeld {
                held_on,
                needed: 2,
                failures,
                attempts: 1,
            }) => {
                let extended = answers.iter().filter(|a| matches!(a, Extended)).count();
                assert_eq!(held_on, extended);
                let timed_out = answers.iter().filter(|a| matches!(a, TimedOut)).count();
                assert_eq!(failures.len(), timed_out);
            }
            other => panic!("not held expected: {other:?}"),
        }
    }
}

#[test]
fn more_failures_than_not_ours_or_no_answer_at_all_is_short_of_nodes() {
    use Answer::*;
    for answers in [
        &[TimedOut, TimedOut, NotOurs][..],
        &[TimedOut, TimedOut],
        &[],
    ] {
        assert!(
            matches!(
                verdict_of(answers),
                Err(LockError::NoQuorum { needed: 2, .. })
            ),
            "{:?}",
            verdict_of(answers)
        );
    }
}
