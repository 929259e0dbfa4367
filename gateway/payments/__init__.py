"""Payments: Stripe Checkout for payment elicitations, and Stripe's webhook."""
