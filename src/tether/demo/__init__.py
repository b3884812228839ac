"""`tether demo`: the lesson's scenarios, end to end, on embedded SQLite."""
