"""Who owns which bytes: the flat layout and the bucket plan, pure integer math."""
