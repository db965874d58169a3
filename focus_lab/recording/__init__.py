"""Recording a forward into tidy tables (the recorder, its tables, spaCy linguistics). Imports method/ and hf/."""
