"""`tether demo`: durable execution's scenarios, end to end, on embedded SQLite."""
