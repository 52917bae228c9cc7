"""What breaks in a fleet, as the live state keeps it: models whose loads fail fleet-wide, and
the requests waiting on an instance that may go down (docs/operations.md, "When part of the
fleet breaks")."""
