"""The travel-booking agent of issue 37's walk-through: its expectations and an on- and off-plan run
(check_budget skipped, book_flight run before book_hotel), shared by the debug-page tests."""

TRAVEL_EXPECTATIONS = """
tasks:
  book-trip:
    expected_steps: [search_flights, check_budget, book_hotel, book_flight, send_confirmation]
    threshold: 0.8
    rules:
      - must_call: check_budget
"""
OFF_PLAN = ["search_flights", "book_flight", "book_hotel", "send_confirmation"]
ON_PLAN = ["search_flights", "check_budget", "book_hotel", "book_flight", "send_confirmation"]
