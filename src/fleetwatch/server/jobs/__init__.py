"""Background work: the scheduler, leader election, and the jobs that keep the database current."""
