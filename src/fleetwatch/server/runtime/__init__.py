"""What every part of the server runs on: advisory locks, the leader, precedence, item isolation,
the scheduler, what leader jobs remember, the urgent lane's queue and the Prometheus families."""
